"""Wan2.2's bench entry (models/bench_entry.py): its workloads, configs, seeded inputs, FLOP count,
and diffusers' WanTransformer3DModel / WanPipeline as the baseline."""

from __future__ import annotations

from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload
from mstar.models.flops import ZERO, BlockShape, FlopCount, gemm_flops
from mstar.models.geometry import Segment
from mstar.models.wan22.config import WAN22_SCHEDULER_CONFIG, Wan22Config, WanDiTConfig, tiny_wan22_config
from mstar.models.wan22.geometry import WanGeometry

TINY_TEXT_TOKENS = 8
TIMESTEP = 500.0


class WanBench(DitBenchEntry):
    family = "wan"
    diffusers_transformer = "WanTransformer3DModel"
    parity = "mstar.models.wan22.parity:wan_parity"
    step_workloads = (
        StepWorkload("wan-480p-b1", 832, 480, 33, 1),
        StepWorkload("wan-480p-cfg", 832, 480, 33, 2),
        StepWorkload("wan-480p-c4", 832, 480, 33, 8),
        StepWorkload("wan-720p-b1", 1280, 704, 121, 1),
        StepWorkload("tiny-wan-cfg", 64, 64, 5, 2, tiny=True),
    )
    e2e_workloads = (
        EndToEndWorkload("wan-480p-t2v", "video", 832, 480, 33, 50, 5.0),
        EndToEndWorkload("wan-720p-t2v", "video", 1280, 704, 121, 50, 5.0),
        EndToEndWorkload("tiny-wan-t2v", "video", 64, 64, 5, 2, 5.0, tiny=True),
    )

    @staticmethod
    def config(tiny: bool) -> Wan22Config:
        return tiny_wan22_config() if tiny else Wan22Config()

    def text_tokens(self, tiny: bool) -> int:
        return TINY_TEXT_TOKENS if tiny else self.config(tiny).max_text_tokens  # padded to 512 as served

    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        return self.config(tiny).dit.to_dict()

    def segments(self, workload: StepWorkload) -> list[Segment]:
        geometry = WanGeometry.of(self.config(workload.tiny))
        tokens = geometry.num_tokens(workload.width, workload.height, workload.num_frames)
        return [Segment(tokens, self.text_tokens(workload.tiny))] * workload.num_items

    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        """Per layer: self attention and FFN on the latent tokens, cross attention to the text;
        once: patch embedding, text projection, timestep embedding (one row a segment), proj_out."""
        c = WanDiTConfig.from_dict(transformer_config)
        dim, patch_volume = c.inner_dim, c.patch_size[0] * c.patch_size[1] * c.patch_size[2]
        block = BlockShape(dim, c.num_attention_heads, c.attention_head_dim, c.ffn_dim, num_ffn_matrices=2)
        total = ZERO
        for segment in segments:
            tokens, text = segment.image_tokens, segment.text_tokens
            layer = block.self_block(tokens) + block.cross_attention(tokens, text)
            embed = (
                gemm_flops(tokens, dim, c.in_channels * patch_volume)  # patch embedding (a strided conv)
                + gemm_flops(text, dim, c.text_dim)  # text projection, 2 layers
                + gemm_flops(text, dim, dim)
                + gemm_flops(1, dim, c.freq_dim)  # time embedder + 6-way modulation projection
                + gemm_flops(1, dim, dim)
                + gemm_flops(1, 6 * dim, dim)
                + gemm_flops(tokens, c.out_channels * patch_volume, dim)  # proj_out
            )
            total = total + layer * c.num_layers + FlopCount(embed, 0.0)
        return total

    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        import torch

        config = self.config(workload.tiny)
        shape = WanGeometry.of(config).latent_shape(workload.width, workload.height, workload.num_frames)
        generator = torch.Generator().manual_seed(seed)
        items = []
        for index in range(workload.num_items):
            if index % 2 == 0:  # a guidance pair shares its latents
                latents = torch.randn(shape, generator=generator)
            text = torch.randn(self.text_tokens(workload.tiny), config.dit.text_dim, generator=generator)
            items.append({"latents": latents, "timestep": TIMESTEP, "text": text})
        return [
            {k: v.to(device, dtype) if hasattr(v, "to") else v for k, v in item.items()} for item in items
        ]

    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        import torch

        latents = torch.stack([item["latents"] for item in items])  # [B, C, F, h, w]
        timesteps = torch.tensor([item["timestep"] for item in items], device=latents.device)
        # Wan2.2 TI2V (expand_timesteps) gives every latent token its own timestep, as the pipeline does.
        _, _, num_frames, height, width = latents.shape
        num_tokens = num_frames * (height // 2) * (width // 2)
        output = model(
            hidden_states=latents,
            timestep=timesteps[:, None].expand(-1, num_tokens),
            encoder_hidden_states=torch.stack([item["text"] for item in items]),
            return_dict=False,
        )[0]
        return list(output.unbind(0))

    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        from mstar.models.wan22.dit import WanDiT

        return WanDiT(WanDiTConfig.from_dict(transformer_config))

    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        from mstar.models.wan22.optimize import optimize

        return optimize(model, fuse=fuse, kernels=kernels)

    def ours_forward(self, model: Any, attention: Any, keep_text: bool):
        from mstar.models.wan22.dit import DiTInput

        kept: dict[int, Any] = {}  # per text tensor, its cross-attention keys and values

        def forward(items: list[dict]) -> list[Any]:
            inputs = []
            for item in items:
                text_kv = None
                if keep_text:
                    key = id(item["text"])
                    text_kv = kept[key] = kept[key] if key in kept else model.text_kv(item["text"])
                inputs.append(
                    DiTInput(item["latents"], float(item["timestep"]), item["text"], text_kv=text_kv)
                )
            return list(model(inputs, attention))

        return forward

    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        """WanPipeline (expand_timesteps) with the Wan VAE in float32, as diffusers' examples load it."""
        import torch
        from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline

        from mstar.bench.baseline import diffusers_transformer

        config = self.config(workload.tiny)
        transformer = diffusers_transformer(
            self, self.transformer_config(workload.tiny), device, dit_dtype, seed
        )
        with torch.device(device):
            vae = AutoencoderKLWan(**config.vae).to(torch.float32)
        scheduler = UniPCMultistepScheduler.from_config(WAN22_SCHEDULER_CONFIG)
        return WanPipeline(
            tokenizer=None, text_encoder=None, vae=vae, scheduler=scheduler, transformer=transformer,
            expand_timesteps=True,
        )  # fmt: skip

    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        import torch

        generator = torch.Generator().manual_seed(seed + 1)
        shape = (1, self.text_tokens(workload.tiny), self.config(workload.tiny).dit.text_dim)
        positive, negative = (torch.randn(shape, generator=generator).to(device, dtype) for _ in range(2))
        return {
            "prompt_embeds": positive,
            "negative_prompt_embeds": negative,
            "num_frames": workload.num_frames,
        }
