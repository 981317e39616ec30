"""FLUX.2's LoRA targets: every Linear of diffusers' model takes an adapter but the per-timestep
ones (the timestep embedder, the global modulations, the output norm's), which an adapter file may
not update; the fused model optimize makes (each stream's q/k/v as one GEMM and the single blocks'
fused projection with queries and keys in halves order) applies a pack's per-request adapters as
the plain model does (CPU)."""

import copy

import pytest
import torch

from mstar.adapters import AdapterFileError
from mstar.diffusion.denoise import COND, DenoiseItem
from mstar.engine.attention import build_attention
from mstar.engine.lora.weights import ModuleLora
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.lora import flux2_lora_targets
from mstar.models.flux2_klein.optimize import optimize
from mstar.models.flux2_klein.pipeline import REFERENCES, Flux2KleinPipeline
from mstar.models.flux2_klein.weights import build_dit
from tests.lora_files import fixed_serving, linear_names, random_adapter

RANK = 4
ADAPTERS = {"x": [(1, 0.7)], "y": [(2, -0.5), (1, 0.3)]}  # "z": none
PER_TIMESTEP = ("time_guidance_embed", "modulation", "norm_out")


def test_every_linear_but_the_per_timestep_ones_takes_lora():
    diffusers_model = pytest.importorskip("tests.models.flux2_klein.tiny_parts").tiny_transformer()
    dit = build_dit(TINY.transformer, "cpu", torch.float32)
    layers = LoraLayers(dit, flux2_lora_targets(dit), num_slots=1, max_rank=RANK)
    names = linear_names(diffusers_model)
    assert sorted(layers.modules) == [n for n in names if not any(part in n for part in PER_TIMESTEP)]
    modulation = "double_stream_modulation_img.linear"
    update = ModuleLora(torch.zeros(RANK, dit.config.inner_dim), torch.zeros(6 * dit.config.inner_dim, RANK))
    with pytest.raises(AdapterFileError, match=modulation):
        layers.pack({modulation: update})


def _items() -> list[DenoiseItem]:
    generator = torch.Generator().manual_seed(3)
    channels, text_dim = TINY.transformer.in_channels, TINY.transformer.joint_attention_dim

    def item(rid, rows, cols, references=()):
        latents = torch.randn(channels, rows, cols, generator=generator)
        text = torch.randn(TINY.max_sequence_length, text_dim, generator=generator)
        grids = [torch.randn(channels, r, c, generator=generator) for r, c in references]
        return DenoiseItem(rid, COND, latents, 700.0, 0.7, 0, text, {REFERENCES: grids})

    return [item("x", 4, 6), item("y", 5, 5, [(4, 4), (3, 6)]), item("z", 6, 3)]


def _predict(dit) -> list[torch.Tensor]:
    layers = LoraLayers(dit, flux2_lora_targets(dit), num_slots=2, max_rank=RANK)
    for slot in (1, 2):
        layers.write(slot, layers.pack(random_adapter(layers, dit, RANK, seed=slot)))
    attention = build_attention("torch", "cpu", torch.float32)
    pipeline = Flux2KleinPipeline(TINY, "cpu", dit=dit, attention=attention)
    pipeline.lora = fixed_serving(layers, ADAPTERS)
    return pipeline.predict(_items())


def test_fused_model_applies_each_requests_adapters_as_the_plain_one():
    dit = build_dit(TINY.transformer, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    without = Flux2KleinPipeline(TINY, "cpu", dit=copy.deepcopy(dit), attention=attention).predict(_items())
    fused = optimize(copy.deepcopy(dit), fuse=True, kernels=False)
    assert hasattr(fused.transformer_blocks[0].attn, "add_qkv")
    want, got = _predict(dit), _predict(fused)
    for index, (a, b) in enumerate(zip(want, got, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        if index < 2:  # x and y: their adapters matter; z has none
            assert (a - without[index]).abs().max() > 1e-2
        else:
            torch.testing.assert_close(a, without[index], rtol=1e-5, atol=1e-5)
