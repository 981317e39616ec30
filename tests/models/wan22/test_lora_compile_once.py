"""A served Wan stack with LoRA layers compiles its graphs once: a new adapter written into a slot,
other slots, scales and segment counts compile nothing (CPU, bf16 so the grouped path traces;
aot_eager in place of inductor, as the other compile-once tests)."""

import pytest
import torch
import torch._dynamo

from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.weights import ModuleLora
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.lora import wan_lora_targets
from mstar.models.wan22.optimize import optimize

OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}
RANK = 8


def _item(frames, height, width, seed):
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(16, frames, height, width, generator=generator)
    return DiTInput(latents, 500.0, torch.randn(16, 16, generator=generator))


def _adapter(layers: LoraLayers, dit, seed: int) -> dict[str, ModuleLora]:
    generator = torch.Generator().manual_seed(seed)
    adapter = {}
    for target in layers.targets:
        in_features = dit.get_submodule(target.module).in_features
        for piece in target.slices:
            down = torch.randn(RANK, in_features, generator=generator)
            adapter[piece.source] = ModuleLora(
                down, 0.1 * torch.randn(piece.out_features, RANK, generator=generator)
            )
    return adapter


# the default tier runs the kernels path (grouped for every Linear but the FFN's first, which
# takes the activation kernel); the plain path repeats the grouped half, so it is in the slow tier
@pytest.mark.parametrize(
    "kernels", [pytest.param(False, marks=pytest.mark.slow), True], ids=["eager", "kernels"]
)
def test_new_adapters_and_packs_compile_nothing(kernels):
    torch.manual_seed(0)
    dit = WanDiT(tiny_wan22_config().dit).eval().to(torch.bfloat16)
    if kernels:  # its FFN adds the first Linear's expand inside the GELU (mstar::lora_activation)
        dit = optimize(dit, fuse=True, kernels=True)
    layers = LoraLayers(dit, wan_lora_targets(dit), num_slots=3, max_rank=RANK)
    layers.write(1, layers.pack(_adapter(layers, dit, 1)))
    attention = build_attention("torch", "cpu", torch.bfloat16)
    (part,) = compile_methods(dit, WanDiT.compiled_methods, "deterministic", "wan.dit", **OPTIONS).parts

    def step(items, adapters):
        lengths = [dit.num_tokens(tuple(item.latents.shape)) for item in items]
        layers.context.set("tokens", LoraRows.build(lengths, adapters, "cpu", torch.bfloat16))
        with torch.inference_mode():
            return dit(items, attention)

    a, b, c = _item(2, 8, 12, 1), _item(2, 12, 8, 2), _item(3, 8, 8, 3)
    step([a, b], [[], []])  # no adapters: the base graph
    step([a, b], [[(1, 0.5)], []])  # the LoRA graph
    warm = part.num_compiles
    layers.write(2, layers.pack(_adapter(layers, dit, 2)))  # a new adapter arrives
    first = step([a, b, c], [[(2, 1.0)], [(1, -0.3)], []])
    step([c], [[(2, 0.7)]])
    step([a, b], [[], []])
    assert part.num_compiles == warm, "a new adapter, scale or pack compiled again"
    layers.clear(2)
    layers.write(2, layers.pack(_adapter(layers, dit, 3)))  # the slot is reused by another adapter
    second = step([a, b, c], [[(2, 1.0)], [(1, -0.3)], []])
    assert part.num_compiles == warm
    assert not torch.equal(first[0], second[0]) and torch.equal(first[2], second[2])
