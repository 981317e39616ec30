"""Cosmos3's bench entry (models/bench_entry.py): workloads, configs, seeded inputs, the counted
FLOPs of a generation step, and diffusers' Cosmos3OmniTransformer / Cosmos3OmniPipeline as the
baseline (which recompute the understanding pathway at every step and label; ours reads it)."""

from __future__ import annotations

from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload
from mstar.models.cosmos3 import geometry
from mstar.models.cosmos3.config import Cosmos3Config, Cosmos3TransformerConfig, tiny_cosmos3_config
from mstar.models.flops import FlopCount
from mstar.models.geometry import Segment

PROMPT_TOKENS = 256  # a chat-formatted prompt with its metadata sentences
TINY_PROMPT_TOKENS = 20
TIMESTEP = 500.0
PROMPT = "a robot arm pours water into a glass on a wooden table, cinematic light"


class Cosmos3Bench(DitBenchEntry):
    family = "cosmos3"
    diffusers_transformer = "Cosmos3OmniTransformer"
    parity = "mstar.models.cosmos3.parity:cosmos3_parity"
    step_workloads = (
        StepWorkload("cosmos3-480p-cfg", 832, 480, 121, 2),  # the write-ups' cell, one guidance pair
        StepWorkload("cosmos3-720p-cfg", 1280, 704, 121, 2),
        StepWorkload("cosmos3-image-cfg", 640, 640, 1, 2),
        StepWorkload("tiny-cosmos3-cfg", 32, 32, 5, 2, tiny=True),
    )
    e2e_workloads = (
        EndToEndWorkload("cosmos3-480p-t2v", "video", 832, 480, 121, 20, 6.0),
        EndToEndWorkload("cosmos3-720p-t2v", "video", 1280, 704, 121, 20, 6.0),
        EndToEndWorkload("tiny-cosmos3-t2v", "video", 32, 32, 5, 2, 6.0, tiny=True),
    )

    @staticmethod
    def config(tiny: bool) -> Cosmos3Config:
        return tiny_cosmos3_config() if tiny else Cosmos3Config()

    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        # no action head on either side (Edge's checkpoint has one; its mode is refused)
        return {**self.config(tiny).transformer.to_dict(), "action_gen": False}

    def _grid(self, workload: StepWorkload) -> tuple[int, int, int]:
        config = self.config(workload.tiny)
        shape = geometry.latent_shape(config.vae, workload.num_frames, workload.height, workload.width)
        return geometry.patch_grid(shape, config.transformer.latent_patch_size)

    def segments(self, workload: StepWorkload) -> list[Segment]:
        tokens = geometry.num_vision_tokens(self._grid(workload))
        prompt = TINY_PROMPT_TOKENS if workload.tiny else PROMPT_TOKENS
        return [Segment(tokens, prompt)] * workload.num_items

    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        """The generation pathway's matmuls per segment: projections, MLP and heads as GEMMs; the
        attention of the vision queries over prefix plus vision keys apart."""
        config = Cosmos3TransformerConfig.from_dict(transformer_config)
        total_gemm, total_attention = 0.0, 0.0
        for segment in segments:
            tokens, prefix = segment.image_tokens, segment.text_tokens
            everything = geometry.generation_flops(config, tokens, prefix)
            attention = config.num_hidden_layers * geometry.attention_flops(config, tokens, prefix + tokens)
            total_gemm += everything - attention
            total_attention += attention
        return FlopCount(total_gemm, total_attention)

    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        import torch

        config = self.config(workload.tiny)
        shape = geometry.latent_shape(config.vae, workload.num_frames, workload.height, workload.width)
        prompt = TINY_PROMPT_TOKENS if workload.tiny else PROMPT_TOKENS
        generator = torch.Generator().manual_seed(seed)
        items = []
        for index in range(workload.num_items):
            if index % 2 == 0:  # a guidance pair shares its latents
                latents = torch.randn(shape, generator=generator).to(device, dtype)
            ids = torch.randint(0, 256, (prompt,), generator=generator).tolist()
            items.append({"latents": latents, "timestep": TIMESTEP, "input_ids": tuple(ids)})
        return items

    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        """Cosmos3OmniTransformer takes one sample a call: one full forward per item (its
        understanding pathway included, as the pipeline runs it at every step)."""
        from mstar.models.cosmos3.reference import diffusers_velocity

        return [diffusers_velocity(model, list(i["input_ids"]), i["latents"], i["timestep"]) for i in items]

    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        from mstar.models.cosmos3.transformer import Cosmos3Transformer

        return Cosmos3Transformer(Cosmos3TransformerConfig.from_dict(transformer_config))

    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        return model  # no fused or kernel-calling modules yet: the eager layers are what runs

    def ours_forward(self, model: Any, attention: Any, keep_text: bool):
        """The served step: prefixes computed once per prompt (with keep_text; else every call),
        then one packed generation forward over every item."""
        from mstar.engine.attention import PrefixAttention, StackedPrefixKV
        from mstar.models.cosmos3.transformer import VisionInput

        dense = PrefixAttention(attention)
        kept: dict[tuple[int, ...], Any] = {}

        def prefix_of(ids: tuple[int, ...]) -> Any:
            if not keep_text:
                return model.understand(list(ids), attention)
            if ids not in kept:
                kept[ids] = model.understand(list(ids), attention)
            return kept[ids]

        def forward(items: list[dict]) -> list[Any]:
            prefixes = StackedPrefixKV([prefix_of(item["input_ids"]) for item in items])
            inputs = [VisionInput(item["latents"], float(item["timestep"])) for item in items]
            return model.generate(inputs, prefixes, dense)

        return forward

    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        """Cosmos3OmniPipeline with seeded random weights, the Wan VAE in float32, an offline
        byte-level tokenizer, no safety checker."""
        import torch
        from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, UniPCMultistepScheduler

        from mstar.bench.baseline import diffusers_transformer
        from mstar.models.cosmos3.reference import scheduler_dict
        from mstar.models.cosmos3.text import offline_tokenizer
        from mstar.models.wan22.config import WAN22_VAE_CONFIG, tiny_wan22_config

        config = self.config(workload.tiny)
        transformer = diffusers_transformer(
            self, self.transformer_config(workload.tiny), device, dit_dtype, seed
        )
        with torch.device(device):
            vae = AutoencoderKLWan(**(tiny_wan22_config().vae if workload.tiny else WAN22_VAE_CONFIG)).to(
                torch.float32
            )
        return Cosmos3OmniPipeline(
            transformer=transformer, text_tokenizer=offline_tokenizer(), vae=vae,
            scheduler=UniPCMultistepScheduler(**scheduler_dict(config)), enable_safety_checker=False,
            default_use_system_prompt=config.pipeline.default_use_system_prompt,
            use_native_flow_schedule=config.pipeline.use_native_flow_schedule,
        )  # fmt: skip

    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        return {"prompt": PROMPT, "num_frames": workload.num_frames, "fps": 24.0}
