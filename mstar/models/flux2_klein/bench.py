"""FLUX.2 [klein]'s bench entry (models/bench_entry.py): its workloads, configs, seeded inputs,
FLOP count, and diffusers' Flux2Transformer2DModel / Flux2KleinPipeline as the baseline.

Items: {"latents": [128, h, w], "timestep": 0..1000, "text": [512, joint_dim], "references":
[[128, h_j, w_j], ...]}; diffusers takes the same items as one batch (same shapes), packed and
with position ids as the pipeline builds them."""

from __future__ import annotations

from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload
from mstar.models.flops import ZERO, FlopCount, attention_flops, gemm_flops
from mstar.models.flux2_klein.config import (
    KLEIN_4B,
    TINY,
    Flux2KleinConfig,
    TransformerConfig,
    from_json_dict,
    to_json_dict,
)
from mstar.models.flux2_klein.geometry import DEFAULT_GUIDANCE_SCALE, DEFAULT_NUM_STEPS, Flux2KleinGeometry
from mstar.models.geometry import Segment

TIMESTEP = 500.0  # the scheduler's scale (0..1000); the model sees t / 1000
TIMESTEP_MID_FACTOR = 1  # TimestepEmbedding: channels -> dim -> dim


class Flux2KleinBench(DitBenchEntry):
    family = "flux2-klein"
    diffusers_transformer = "Flux2Transformer2DModel"
    parity = "mstar.models.flux2_klein.parity:flux2_klein_parity"
    step_workloads = (
        StepWorkload("flux2-1024-b1", 1024, 1024, 1, 1),
        StepWorkload("flux2-1024-c4", 1024, 1024, 1, 4),
        StepWorkload("flux2-1024-c8", 1024, 1024, 1, 8),
        StepWorkload("tiny-flux2-c2", 32, 32, 1, 2, tiny=True),
    )
    e2e_workloads = (
        EndToEndWorkload("flux2-1024", "image", 1024, 1024, 1, DEFAULT_NUM_STEPS, DEFAULT_GUIDANCE_SCALE),
        EndToEndWorkload("tiny-flux2", "image", 64, 64, 1, 2, DEFAULT_GUIDANCE_SCALE, tiny=True),
    )

    @staticmethod
    def config(tiny: bool) -> Flux2KleinConfig:
        return TINY if tiny else KLEIN_4B

    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        return to_json_dict(self.config(tiny).transformer)

    def segments(self, workload: StepWorkload) -> list[Segment]:
        geometry = Flux2KleinGeometry.of(self.config(workload.tiny))
        (segment,) = geometry.segments(workload.width, workload.height, 1.0)
        return [segment] * workload.num_items

    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        """Double-stream blocks (each stream its own q/k/v/out and SwiGLU FFN, one joint attention),
        single-stream blocks (one fused qkv+MLP-in projection, one out projection over [attention,
        MLP]), the embedders and the output projection; per item the timestep MLP and the three
        modulations and the output norm's rows."""
        c = from_json_dict(TransformerConfig, transformer_config)
        dim, mlp, heads, head_dim = c.inner_dim, c.mlp_hidden_dim, c.num_attention_heads, c.attention_head_dim
        total = ZERO
        for segment in segments:
            image, text = segment.image_tokens, segment.text_tokens
            joint = image + text
            stream = 4 * gemm_flops(joint, dim, dim) + 3 * gemm_flops(joint, mlp, dim)  # both streams' rows
            double = FlopCount(stream, attention_flops(joint, joint, heads, head_dim)) * c.num_layers
            single_gemm = gemm_flops(joint, 3 * dim + 2 * mlp, dim) + gemm_flops(joint, dim, dim + mlp)
            single = (
                FlopCount(single_gemm, attention_flops(joint, joint, heads, head_dim)) * c.num_single_layers
            )
            embed = (
                gemm_flops(image, dim, c.in_channels)
                + gemm_flops(text, dim, c.joint_attention_dim)
                + gemm_flops(image, c.num_out_channels, dim)  # proj_out (output tokens; references too here)
            )
            conditioning = (
                gemm_flops(1, dim, c.timestep_guidance_channels)
                + gemm_flops(1, dim, dim)
                + gemm_flops(1, (6 + 6 + 3) * dim, dim)
                + gemm_flops(1, 2 * dim, dim)
            )
            total = total + double + single + FlopCount(embed + conditioning, 0.0)
        return total

    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        import torch

        config = self.config(workload.tiny)
        rows, cols = Flux2KleinGeometry.of(config).latent_grid(workload.width, workload.height)
        generator = torch.Generator().manual_seed(seed)
        items = []
        for _ in range(workload.num_items):
            latents = torch.randn((config.transformer.in_channels, rows, cols), generator=generator)
            text = torch.randn(
                config.max_sequence_length, config.transformer.joint_attention_dim, generator=generator
            )
            items.append(
                {"latents": latents.to(device, dtype), "timestep": TIMESTEP, "text": text.to(device, dtype)}
            )
        return items

    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        """The items as one batch, called as Flux2KleinPipeline calls the transformer."""
        import torch
        from diffusers import Flux2KleinPipeline as Pipe

        latents = torch.stack([item["latents"] for item in items])
        text = torch.stack([item["text"] for item in items])
        device = latents.device
        timestep = torch.tensor([item["timestep"] for item in items], device=device).to(latents.dtype)
        out = model(
            hidden_states=Pipe._pack_latents(latents), timestep=timestep / 1000, guidance=None,
            encoder_hidden_states=text, txt_ids=Pipe._prepare_text_ids(text).to(device),
            img_ids=Pipe._prepare_latent_ids(latents).to(device), return_dict=False,
        )[0]  # fmt: skip
        channels, rows, cols = items[0]["latents"].shape
        return [o[: rows * cols].transpose(0, 1).reshape(channels, rows, cols) for o in out]

    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        from mstar.models.flux2_klein.dit import Flux2DiT

        return Flux2DiT.from_config(transformer_config)

    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        from mstar.models.flux2_klein.optimize import optimize

        return optimize(model, fuse=fuse, kernels=kernels)

    def ours_forward(self, model: Any, attention: Any, keep_text: bool):
        from mstar.models.flux2_klein.dit import DiTInput

        def forward(items: list[dict]) -> list[Any]:
            inputs = [
                DiTInput(item["latents"], float(item["timestep"]), item["text"], item.get("references", ()))
                for item in items
            ]
            return list(model(inputs, attention))

        return forward

    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        import torch
        from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

        from mstar.bench.baseline import diffusers_transformer
        from mstar.models.flux2_klein.parity import diffusers_vae_config, scheduler_kwargs

        config = self.config(workload.tiny)
        transformer = diffusers_transformer(
            self, self.transformer_config(workload.tiny), device, dit_dtype, seed
        )
        with torch.device(device):
            vae = AutoencoderKLFlux2(**diffusers_vae_config(config.vae)).to(dit_dtype)
        return Flux2KleinPipeline(
            scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_kwargs(config.scheduler)), vae=vae.eval(),
            text_encoder=None, tokenizer=None, transformer=transformer, is_distilled=config.is_distilled,
        )  # fmt: skip

    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        import torch

        config = self.config(workload.tiny)
        generator = torch.Generator().manual_seed(seed + 1)
        shape = (1, config.max_sequence_length, config.transformer.joint_attention_dim)
        return {"prompt_embeds": torch.randn(shape, generator=generator).to(device, dtype)}
