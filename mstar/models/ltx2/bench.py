"""LTX-2's bench entry (models/bench_entry.py): workloads at the pipeline's default size and length
and at 1280x704, the released transformer config, seeded inputs, the FLOP count (geometry's), and
diffusers' LTX2VideoTransformer3DModel / LTX2Pipeline as the baseline.

A step's items are one request's guidance passes (cond, uncond, isolated: geometry's labels), each
with video and audio latents; outputs are flattened to [video, audio] per item, so the step
benchmark's relative error covers both streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload
from mstar.models.flops import ZERO, FlopCount
from mstar.models.geometry import Segment
from mstar.models.ltx2 import geometry
from mstar.models.ltx2.config import DiTConfig, LTX2Config, from_json_dict, to_json_dict
from mstar.models.ltx2.presets import LTX2, TINY

TIMESTEP = 500.0
LABELS = (geometry.COND, geometry.UNCOND, geometry.ISOLATED)  # a guided LTX-2 step's passes


@dataclass(frozen=True)
class AVSegment(Segment):
    """A packed item: video tokens (image_tokens), audio tokens, text tokens, and whether it skips
    the audio-video cross attention (modality guidance's isolated pass)."""

    audio_tokens: int = 0
    isolated: bool = False


class LTX2Bench(DitBenchEntry):
    family = "ltx2"
    diffusers_transformer = "LTX2VideoTransformer3DModel"
    parity = "mstar.models.ltx2.parity:ltx2_parity"
    step_workloads = (
        StepWorkload("ltx2-512p-b1", 768, 512, 121, 1),
        StepWorkload("ltx2-512p-guided", 768, 512, 121, 3),
        StepWorkload("ltx2-704p-guided", 1280, 704, 121, 3),
        StepWorkload("tiny-ltx2-guided", 64, 64, 9, 3, tiny=True),
    )
    e2e_workloads = (
        EndToEndWorkload("ltx2-512p-t2v", "video", 768, 512, 121, 30, 3.0),
        EndToEndWorkload("ltx2-704p-t2v", "video", 1280, 704, 121, 30, 3.0),
        EndToEndWorkload("tiny-ltx2-t2v", "video", 64, 64, 9, 3, 3.0, tiny=True),
    )

    @staticmethod
    def config(tiny: bool) -> LTX2Config:
        return TINY if tiny else LTX2

    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        return to_json_dict(self.config(tiny).dit)

    def segments(self, workload: StepWorkload) -> list[Segment]:
        config = self.config(workload.tiny)
        fps = config.defaults.frame_rate
        video = geometry.video_geometry(workload.num_frames, workload.height, workload.width, fps, config)
        audio = geometry.audio_geometry(workload.num_frames, fps, config)
        num_video, num_audio = geometry.num_video_tokens(video, config.dit), geometry.num_audio_tokens(audio)
        text = config.defaults.max_sequence_length
        return [
            AVSegment(num_video, text, num_audio, LABELS[index % len(LABELS)] == geometry.ISOLATED)
            for index in range(workload.num_items)
        ]

    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        dit = from_json_dict(DiTConfig, transformer_config)
        total = ZERO
        for s in segments:
            audio, isolated = getattr(s, "audio_tokens", 0), getattr(s, "isolated", False)
            gemm, attention = geometry.forward_flops(dit, s.image_tokens, audio, s.text_tokens, not isolated)
            total = total + FlopCount(gemm, attention)
        return total

    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        import torch

        config = self.config(workload.tiny)
        fps = config.defaults.frame_rate
        video_geo = geometry.video_geometry(workload.num_frames, workload.height, workload.width, fps, config)
        audio_geo = geometry.audio_geometry(workload.num_frames, fps, config)
        text_len, c = config.defaults.max_sequence_length, config.connectors
        generator = torch.Generator().manual_seed(seed)
        items = []
        for index in range(workload.num_items):
            label = LABELS[index % len(LABELS)]
            if label == geometry.COND:  # a request's passes share its latents and, but uncond, its text
                video = torch.randn(video_geo.latent_shape, generator=generator)
                audio = torch.randn(audio_geo.latent_shape, generator=generator)
                texts = (
                    torch.randn(text_len, c.video_dim, generator=generator),
                    torch.randn(text_len, c.audio_dim, generator=generator),
                )
            text = texts
            if label == geometry.UNCOND:
                text = (
                    torch.randn(text_len, c.video_dim, generator=generator),
                    torch.randn(text_len, c.audio_dim, generator=generator),
                )
            items.append({
                "video": video.to(device, torch.float32), "audio": audio.to(device, torch.float32),
                "video_text": text[0].to(device, dtype), "audio_text": text[1].to(device, dtype),
                "timestep": TIMESTEP, "frame_rate": fps, "isolated": label == geometry.ISOLATED,
            })  # fmt: skip
        return items

    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        """As LTX2Pipeline calls it: the non-isolated passes as one batch, the isolated ones as
        another (isolate_modalities is one flag a call)."""
        outputs: dict[int, tuple[Any, Any]] = {}
        for isolated in (False, True):
            indices = [i for i, item in enumerate(items) if item["isolated"] == isolated]
            if indices:
                batch = _diffusers_batch(model, [items[i] for i in indices], isolated)
                outputs.update(zip(indices, batch, strict=True))
        return [tensor for index in range(len(items)) for tensor in outputs[index]]

    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        from mstar.models.ltx2.dit import LTX2DiT

        return LTX2DiT(from_json_dict(DiTConfig, transformer_config))

    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        from mstar.models.ltx2.optimize import optimize

        return optimize(model, fuse=fuse, kernels=kernels)

    def ours_forward(self, model: Any, attention: Any, keep_text: bool):
        from mstar.models.ltx2.dit import DiTInput

        kept: dict[int, Any] = {}  # per text tensor, its cross-attention keys and values (as served)

        def text_kv(item: dict) -> Any:
            if not (keep_text and model.keeps_text_kv):
                return None
            key = id(item["video_text"])
            if key not in kept:
                kept[key] = model.text_kv(item["video_text"], item["audio_text"])
            return kept[key]

        def forward(items: list[dict]) -> list[Any]:
            inputs = [
                DiTInput(
                    item["video"],
                    item["audio"],
                    float(item["timestep"]),
                    item["video_text"],
                    item["audio_text"],
                    frame_rate=item["frame_rate"],
                    isolated=item["isolated"],
                    text_kv=text_kv(item),
                )  # fmt: skip
                for item in items
            ]
            return [tensor for pair in model(inputs, attention) for tensor in pair]

        return forward

    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        """LTX2Pipeline with seeded random weights of every component but the text encoder (its
        hidden states are passed in), all in the DiT's dtype as diffusers' LTX-2 example loads it."""
        from mstar.models.ltx2.parity import diffusers_components

        return diffusers_components(self.config(workload.tiny), device, seed, dit_dtype)

    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        """Seeded stand-ins for Gemma 3's stacked hidden states (the pipeline runs the connectors)."""
        import torch

        config = self.config(workload.tiny)
        text_len = config.defaults.max_sequence_length
        features = config.connectors.caption_channels * config.connectors.text_proj_in_factor
        generator = torch.Generator().manual_seed(seed + 1)
        embeds = [torch.randn(1, text_len, features, generator=generator).to(device, dtype) for _ in range(2)]
        mask = torch.ones(1, text_len, dtype=torch.long, device=device)
        return {
            "prompt_embeds": embeds[0], "prompt_attention_mask": mask,
            "negative_prompt_embeds": embeds[1], "negative_prompt_attention_mask": mask,
            "num_frames": workload.num_frames, "frame_rate": config.defaults.frame_rate,
        }  # fmt: skip


def _diffusers_batch(model: Any, items: list[dict], isolated: bool) -> list[tuple[Any, Any]]:
    import torch
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    c = model.config
    p, pt = c.patch_size, c.patch_size_t
    dtype = items[0]["video_text"].dtype
    _, frames, height, width = items[0]["video"].shape
    _, audio_frames, mel_bins = items[0]["audio"].shape
    video = LTX2Pipeline._pack_latents(torch.stack([i["video"] for i in items]), p, pt).to(dtype)
    audio = LTX2Pipeline._pack_audio_latents(torch.stack([i["audio"] for i in items])).to(dtype)
    timestep = torch.tensor([i["timestep"] for i in items], device=video.device)
    video_out, audio_out = model(
        hidden_states=video, audio_hidden_states=audio,
        encoder_hidden_states=torch.stack([i["video_text"] for i in items]),
        audio_encoder_hidden_states=torch.stack([i["audio_text"] for i in items]),
        timestep=timestep, audio_timestep=timestep, sigma=timestep, num_frames=frames // pt,
        height=height // p, width=width // p, fps=items[0]["frame_rate"], audio_num_frames=audio_frames,
        isolate_modalities=isolated, use_cross_timestep=True, return_dict=False,
    )  # fmt: skip
    video_out = LTX2Pipeline._unpack_latents(video_out, frames // pt, height // p, width // p, p, pt)
    audio_out = LTX2Pipeline._unpack_audio_latents(audio_out, audio_frames, mel_bins)
    return list(zip(video_out.unbind(0), audio_out.unbind(0), strict=True))
