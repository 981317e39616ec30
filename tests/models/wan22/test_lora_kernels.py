"""The Wan DiT with its kernel modules and LoRA layers applies a pack's per-request adapters as the
plain DiT does (CPU, float32: the ops are their PyTorch definitions), the FFN's first Linear
through the GELU that adds its expand (the "activation" path), the others through the rule's."""

import copy

import torch

from mstar.engine.attention import build_attention
from mstar.engine.lora.activation import fuses_lora
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.lora import wan_lora_targets
from mstar.models.wan22.optimize import optimize
from tests.lora_files import random_adapter

RANK = 4
CHOICES = [[(1, 0.7)], [(2, -0.5), (1, 0.3)], []]  # the third item applies none


def _items() -> list[DiTInput]:
    generator = torch.Generator().manual_seed(2)
    shapes = ((2, 8, 8), (3, 6, 10), (2, 10, 6))
    return [
        DiTInput(
            torch.randn(16, *shape, generator=generator), 400.0 + i, torch.randn(9, 16, generator=generator)
        )
        for i, shape in enumerate(shapes)
    ]


def _run(dit, layers, items, choices):
    lengths = [dit.num_tokens(tuple(item.latents.shape)) for item in items]
    layers.context.set("tokens", LoraRows.build(lengths, choices, "cpu", torch.float32))
    with torch.no_grad():
        return dit(items, build_attention("torch", "cpu", torch.float32))


def test_kernel_model_applies_each_requests_adapters_as_the_plain_one():
    torch.manual_seed(0)
    plain = WanDiT(tiny_wan22_config().dit).eval()
    kernel = optimize(copy.deepcopy(plain), fuse=True, kernels=True)
    plain_layers = LoraLayers(plain, wan_lora_targets(plain), num_slots=2, max_rank=RANK)
    kernel_layers = LoraLayers(kernel, wan_lora_targets(kernel), num_slots=2, max_rank=RANK)
    for slot in (1, 2):  # the same adapter (by diffusers module) into both models' slots
        adapter = random_adapter(plain_layers, plain, RANK, seed=slot)
        plain_layers.write(slot, plain_layers.pack(adapter))
        kernel_layers.write(slot, kernel_layers.pack(adapter))
    projections = [block.ffn.net[0].proj for block in kernel.blocks]
    assert all(proj.lora_path == "activation" for proj in projections)
    assert all(block.ffn.net[0].proj.lora_path != "activation" for block in plain.blocks)
    items = _items()
    want = _run(plain, plain_layers, items, CHOICES)
    got = _run(kernel, kernel_layers, items, CHOICES)
    assert all(fuses_lora(proj) for proj in projections)
    without = _run(plain, plain_layers, items, [[], [], []])
    for index, (a, b) in enumerate(zip(want, got, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        if index < 2:  # their adapters matter; the third has none
            assert (a - without[index]).abs().max() > 1e-2
        else:
            torch.testing.assert_close(a, without[index], rtol=1e-5, atol=1e-5)
