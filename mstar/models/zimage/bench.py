"""Z-Image-Turbo's bench entry (models/bench_entry.py): its workloads, configs, seeded inputs, FLOP
count, and diffusers' ZImageTransformer2DModel / ZImagePipeline as the baseline."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload
from mstar.models.flops import ZERO, BlockShape, FlopCount, gemm_flops
from mstar.models.geometry import Segment
from mstar.models.zimage.config import (
    REAL,
    TINY,
    DiTConfig,
    ZImageConfig,
    diffusers_vae_config,
    from_json_dict,
    to_json_dict,
)
from mstar.models.zimage.geometry import ZImageGeometry, padded_len

TEXT_TOKENS = 128  # a typical Qwen3 prompt length after padding to 32 (4,096 + 128 = 4,224 tokens)
TINY_TEXT_TOKENS = 8
TIMESTEP = 0.5  # the DiT's input scale: (1000 - t) / 1000
ADALN_DIM = 256  # diffusers' ADALN_EMBED_DIM
TIMESTEP_MID = 1024
FREQUENCY_DIM = 256


class ZImageBench(DitBenchEntry):
    family = "zimage"
    diffusers_transformer = "ZImageTransformer2DModel"
    parity = "mstar.models.zimage.parity:zimage_parity"
    step_workloads = (
        StepWorkload("zimage-1024-b1", 1024, 1024, 1, 1),
        StepWorkload("zimage-1024-c4", 1024, 1024, 1, 4),
        StepWorkload("zimage-1024-c8", 1024, 1024, 1, 8),  # the c=8 serving target's pack
        StepWorkload("zimage-512-b1", 512, 512, 1, 1),  # where host time may bound a step
        StepWorkload("tiny-zimage-c2", 16, 16, 1, 2, tiny=True),
    )
    e2e_workloads = (
        EndToEndWorkload("zimage-1024", "image", 1024, 1024, 1, 9, 0.0),
        EndToEndWorkload("zimage-512", "image", 512, 512, 1, 9, 0.0),  # where host time may bound
        EndToEndWorkload("tiny-zimage", "image", 64, 64, 1, 2, 0.0, tiny=True),
    )

    @staticmethod
    def config(tiny: bool) -> ZImageConfig:
        return TINY if tiny else REAL

    @staticmethod
    def text_tokens(tiny: bool) -> int:
        return TINY_TEXT_TOKENS if tiny else TEXT_TOKENS

    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        return to_json_dict(self.config(tiny).dit)

    def segments(self, workload: StepWorkload) -> list[Segment]:
        geometry = ZImageGeometry.of(self.config(workload.tiny))
        image = geometry.image_tokens(workload.width, workload.height)
        return [Segment(image, padded_len(self.text_tokens(workload.tiny)))] * workload.num_items

    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        """Refiners on image and caption tokens apart, the main layers on both joined; per item (not
        per token) the timestep MLP, each modulated block's 4-way modulation and the final scale."""
        c = from_json_dict(DiTConfig, transformer_config)
        dim, patch_features = c.dim, c.in_channels * c.patch_size * c.patch_size * c.f_patch_size
        block = BlockShape(dim, c.n_heads, c.dim // c.n_heads, int(dim / 3 * 8), num_ffn_matrices=3)
        adaln = min(dim, ADALN_DIM)
        total = ZERO
        for segment in segments:
            image, text = segment.image_tokens, segment.text_tokens
            refiners = (block.self_block(image) + block.self_block(text)) * c.n_refiner_layers
            main = block.self_block(image + text) * c.n_layers
            embed = (
                gemm_flops(image, dim, patch_features)
                + gemm_flops(text, dim, c.cap_feat_dim)
                + gemm_flops(image + text, patch_features, dim)
            )
            conditioning = (
                gemm_flops(1, TIMESTEP_MID, FREQUENCY_DIM)
                + gemm_flops(1, adaln, TIMESTEP_MID)
                + (c.n_refiner_layers + c.n_layers) * gemm_flops(1, 4 * dim, adaln)
                + gemm_flops(1, dim, adaln)
            )
            total = total + refiners + main + FlopCount(embed + conditioning, 0.0)
        return total

    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        import torch

        config = self.config(workload.tiny)
        h, w = ZImageGeometry.of(config).latent_size(workload.width, workload.height)
        generator = torch.Generator().manual_seed(seed)
        items = []
        for _ in range(workload.num_items):
            latents = torch.randn((config.dit.in_channels, 1, h, w), generator=generator)  # [C, F=1, h, w]
            text = torch.randn(self.text_tokens(workload.tiny), config.dit.cap_feat_dim, generator=generator)
            items.append({"latents": latents, "timestep": TIMESTEP, "text": text})
        return [
            {k: v.to(device, dtype) if hasattr(v, "to") else v for k, v in item.items()} for item in items
        ]

    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        import torch

        latents = [item["latents"] for item in items]
        timesteps = torch.tensor([item["timestep"] for item in items], device=latents[0].device)
        texts = [item["text"] for item in items]
        return list(model(latents, timesteps.to(latents[0].dtype), texts, return_dict=False)[0])

    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        from mstar.models.zimage.dit import ZImageDiT

        return ZImageDiT.from_config(transformer_config)

    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        from mstar.models.zimage.optimize import optimize

        return optimize(model, fuse=fuse, kernels=kernels)

    def ours_forward(self, model: Any, attention: Any, keep_text: bool):
        from mstar.models.zimage.dit import DiTInput

        kept: dict[int, Any] = {}  # per text tensor, its tokens after the context refiner

        def forward(items: list[dict]) -> list[Any]:
            inputs = []
            for item in items:
                refined = None
                if keep_text:
                    key = id(item["text"])
                    refined = kept[key] = (
                        kept[key] if key in kept else model.refine_caption(item["text"], attention)
                    )
                latents = item["latents"].squeeze(1)  # [C, 1, h, w] as diffusers takes it -> [C, h, w]
                inputs.append(
                    DiTInput(latents, float(item["timestep"]), item["text"], refined_caption=refined)
                )
            return list(model(inputs, attention))

        return forward

    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        import torch
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline

        from mstar.bench.baseline import diffusers_transformer

        config = self.config(workload.tiny)
        transformer = diffusers_transformer(
            self, self.transformer_config(workload.tiny), device, dit_dtype, seed
        )
        with torch.device(device):
            vae = AutoencoderKL(**diffusers_vae_config(config.vae)).to(dit_dtype)
        scheduler_config = asdict(config.scheduler)
        scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=scheduler_config["num_train_timesteps"], shift=scheduler_config["shift"],
            use_dynamic_shifting=scheduler_config["use_dynamic_shifting"],
        )  # fmt: skip
        return ZImagePipeline(
            scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None, transformer=transformer
        )

    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        import torch

        generator = torch.Generator().manual_seed(seed + 1)
        shape = (self.text_tokens(workload.tiny), self.config(workload.tiny).dit.cap_feat_dim)
        return {"prompt_embeds": [torch.randn(shape, generator=generator).to(device, dtype)]}
