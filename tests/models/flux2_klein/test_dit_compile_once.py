"""The DiT's compiled stacks (run_blocks) as build_dit_node compiles them: one graph for a single
item and one for every packing of several (sizes, text lengths and reference counts vary), with
outputs equal to eager (CPU; aot_eager runs inductor's graph passes without its kernels).

In the slow tier: the served stacks (fused projections, and the kernels path over them) hold the
same compile-once rule in the default tier (test_optimize.py, test_kernels.py)."""

import pytest
import torch
import torch._dynamo

from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import DiTInput, Flux2DiT
from mstar.models.flux2_klein.weights import build_dit

SERVED_OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}
pytestmark = pytest.mark.slow
CHANNELS, TEXT_DIM = TINY.transformer.in_channels, TINY.transformer.joint_attention_dim


def _items(shapes):
    """shapes: (rows, cols, references as ((rows, cols), ...)) per item."""
    generator = torch.Generator().manual_seed(0)
    return [
        DiTInput(
            torch.randn(CHANNELS, rows, cols, generator=generator), 300.0 + 100 * index,
            torch.randn(TINY.max_sequence_length, TEXT_DIM, generator=generator),
            [torch.randn(CHANNELS, r, c, generator=generator) for r, c in references],
        )
        for index, (rows, cols, references) in enumerate(shapes)
    ]  # fmt: skip


BATCHES = [
    [(6, 5, ())],
    [(6, 5, ())] * 2,
    [(6, 5, ()), (4, 8, ((6, 4),)), (5, 5, ((4, 4), (3, 7)))],
    [(8, 8, ())],
    [(4, 4, ((5, 5),)), (7, 3, ())],
]


def test_the_blocks_compile_once_for_one_item_and_once_for_packs_and_match_eager():
    dit = build_dit(TINY.transformer, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    with torch.inference_mode():
        eager = [dit(_items(shapes), attention) for shapes in BATCHES]
        parts = compile_methods(
            dit, Flux2DiT.compiled_methods, "deterministic", "flux2.dit", **SERVED_OPTIONS
        )
        compiled = [dit(_items(shapes), attention) for shapes in BATCHES]
    (part,) = parts.parts
    assert part.num_compiles <= 2  # one item (no token maps) and packs (token maps)
    for want, got in zip(eager, compiled, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
