"""Z-Image's served stacks with LoRA layers compile their graphs once: a new adapter written into a
slot, other slots, scales, item counts and sizes compile nothing (CPU, bf16 so the grouped path
traces; aot_eager in place of inductor, as the other compile-once tests). The model is the tiny one
widened so every Linear's rows are 16-byte aligned, as the real model's are: the grouped GEMM takes
them all (an unaligned one takes the host-read reference, a graph break)."""

import dataclasses

import pytest
import torch
import torch._dynamo

from mstar.diffusion.denoise import COND, DenoiseItem
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import ZImageDiT
from mstar.models.zimage.lora import zimage_lora_targets
from mstar.models.zimage.optimize import optimize
from mstar.models.zimage.pipeline import ZImagePipeline
from mstar.models.zimage.weights import build_dit
from tests.lora_files import compiles_of, predict_with, random_adapter

OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}
RANK = 8
CONFIG = dataclasses.replace(TINY.dit, dim=48, n_heads=3, n_kv_heads=3, n_layers=1)  # SwiGLU hidden 128


def _item(rid, height, width, caption_tokens, seed):
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(16, height, width, generator=generator)
    text = torch.randn(caption_tokens, CONFIG.cap_feat_dim, generator=generator)
    return DenoiseItem(rid, COND, latents, 400.0, 0.4, 0, text, {})


# the default tier runs the kernels path (grouped for every Linear but the FFN's first, which
# takes the activation kernel); the plain path repeats the grouped half, so it is in the slow tier
@pytest.mark.parametrize(
    "kernels", [pytest.param(False, marks=pytest.mark.slow), True], ids=["eager", "kernels"]
)
def test_new_adapters_and_packs_compile_nothing(kernels):
    torch.manual_seed(0)
    dit = build_dit(CONFIG, "cpu", torch.bfloat16)
    if kernels:  # its SwiGLU adds w13's expand inside the activation (mstar::lora_activation)
        dit = optimize(dit, fuse=True, kernels=True)
    layers = LoraLayers(dit, zimage_lora_targets(dit), num_slots=3, max_rank=RANK)
    layers.write(1, layers.pack(random_adapter(layers, dit, RANK, seed=1)))
    parts = compile_methods(dit, ZImageDiT.compiled_methods, "deterministic", "zimage.dit", **OPTIONS)
    pipeline = ZImagePipeline(
        dataclasses.replace(TINY, dit=CONFIG),
        "cpu",
        dit=dit,
        attention=build_attention("torch", "cpu", torch.bfloat16),
    )

    def step(adapters, *sizes):
        items = [_item("abc"[index], *size, seed=index) for index, size in enumerate(sizes)]
        return predict_with(pipeline, layers, items, adapters)

    first, second, third = (8, 10, 7), (12, 6, 20), (6, 6, 5)
    step({"a": [(1, 0.5)]}, first)  # the LoRA graph of each stack, as the boot warmup compiles it
    step({"a": [(1, 0.5)]}, first, first)
    warm = compiles_of(parts)
    layers.write(2, layers.pack(random_adapter(layers, dit, RANK, seed=2)))  # a new adapter arrives
    before = step({"a": [(2, 1.0)], "b": [(1, -0.3)]}, first, second, third)
    step({"a": [(2, 0.7)]}, third)
    step({"b": [(2, -2.0)], "a": [(1, 0.1)]}, second, first)
    assert compiles_of(parts) == warm, "a new adapter, slot, scale or pack compiled again"
    layers.clear(2)
    layers.write(2, layers.pack(random_adapter(layers, dit, RANK, seed=3)))  # the slot takes another
    after = step({"a": [(2, 1.0)], "b": [(1, -0.3)]}, first, second, third)
    assert compiles_of(parts) == warm
    assert not torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
