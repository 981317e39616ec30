"""FLUX.2's served stack with LoRA layers compiles its graphs once (one for a single item, one for
packs): a new adapter written into a slot, other slots, scales, item counts, sizes and reference
counts compile nothing (CPU, bf16 so the grouped path traces; aot_eager in place of inductor, as
the other compile-once tests; one block of each kind, which is what a graph holds per block)."""

import dataclasses

import torch
import torch._dynamo

from mstar.diffusion.denoise import COND, DenoiseItem
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import Flux2DiT
from mstar.models.flux2_klein.lora import flux2_lora_targets
from mstar.models.flux2_klein.pipeline import REFERENCES, Flux2KleinPipeline
from mstar.models.flux2_klein.weights import build_dit
from tests.lora_files import compiles_of, predict_with, random_adapter

OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}
RANK = 8
CONFIG = dataclasses.replace(
    TINY, transformer=dataclasses.replace(TINY.transformer, num_layers=1, num_single_layers=1)
)
CHANNELS, TEXT_DIM = CONFIG.transformer.in_channels, CONFIG.transformer.joint_attention_dim


def _item(rid, rows, cols, references, seed):
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(CHANNELS, rows, cols, generator=generator)
    text = torch.randn(CONFIG.max_sequence_length, TEXT_DIM, generator=generator)
    grids = [torch.randn(CHANNELS, r, c, generator=generator) for r, c in references]
    return DenoiseItem(rid, COND, latents, 600.0, 0.6, 0, text, {REFERENCES: grids})


def test_new_adapters_and_packs_compile_nothing():
    torch.manual_seed(0)
    dit = build_dit(CONFIG.transformer, "cpu", torch.bfloat16)
    layers = LoraLayers(dit, flux2_lora_targets(dit), num_slots=3, max_rank=RANK)
    layers.write(1, layers.pack(random_adapter(layers, dit, RANK, seed=1)))
    parts = compile_methods(dit, Flux2DiT.compiled_methods, "deterministic", "flux2.dit", **OPTIONS)
    attention = build_attention("torch", "cpu", torch.bfloat16)
    pipeline = Flux2KleinPipeline(CONFIG, "cpu", dit=dit, attention=attention)

    def step(adapters, *shapes):
        items = [_item("abc"[index], *shape, seed=index) for index, shape in enumerate(shapes)]
        return predict_with(pipeline, layers, items, adapters)

    first, second, third = (4, 6, ()), (5, 5, ((4, 4), (3, 6))), (6, 3, ((5, 4),))
    step({"a": [(1, 0.5)]}, first)  # the LoRA graphs (one item, a pack), as the boot warmup compiles them
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
