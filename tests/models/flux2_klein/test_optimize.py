"""optimize(): the fused FLUX.2 DiT equals the eager one (tiny config, CPU fp32) for one item and
for packs of requests with different sizes, timesteps and reference counts; it is built from a
checkpoint in diffusers' keys, and its stacks compile once for one item and once for packs."""

import copy

import pytest
import torch
import torch._dynamo

from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import Flux2DiT
from mstar.models.flux2_klein.dit_layers import JointAttention, ParallelSelfAttention
from mstar.models.flux2_klein.optimize import FusedJointAttention, FusedParallelSelfAttention, optimize
from mstar.models.flux2_klein.weights import build_dit
from tests.models.flux2_klein.test_dit import diffusers_output, make_item, psnr_db

PACKS = [
    [(6, 5, (), 731.25)],
    [(5, 5, ((4, 4), (3, 7)), 500.0)],
    [(4, 6, (), 980.0), (6, 4, ((4, 4), (2, 6)), 500.0), (4, 4, ((6, 6),), 120.5), (8, 2, ((4, 5),), 980.0)],
    [(3, 3, ((2, 2), (2, 3), (3, 2)), 10.0), (7, 3, (), 640.0)],
]


def _items(pack, seed=0):
    return [
        make_item(rows, cols, references, timestep=timestep, seed=seed + index)
        for index, (rows, cols, references, timestep) in enumerate(pack)
    ]


def _run(dit, items):
    with torch.no_grad():
        return dit(items, build_attention("torch", "cpu", torch.float32))


@pytest.fixture(scope="module")
def eager_and_fused():
    eager = build_dit(TINY.transformer, "cpu", torch.float32, seed=7)
    return eager, optimize(copy.deepcopy(eager), fuse=True, kernels=False)


def test_optimize_swaps_every_attention_and_drops_the_separate_weights(eager_and_fused):
    _, fused = eager_and_fused
    assert all(isinstance(b.attn, FusedJointAttention) for b in fused.transformer_blocks)
    assert all(isinstance(b.attn, FusedParallelSelfAttention) for b in fused.single_transformer_blocks)
    names = set(fused.state_dict())
    assert not any(n.endswith(("attn.to_q.weight", "attn.add_q_proj.weight")) for n in names)
    dim = TINY.transformer.inner_dim
    assert fused.transformer_blocks[0].attn.to_qkv.weight.shape == (3 * dim, dim)


def test_unfused_model_is_left_alone_without_fuse():
    dit = build_dit(TINY.transformer, "cpu", torch.float32)
    assert optimize(dit, fuse=False, kernels=False) is dit
    assert all(type(b.attn) is JointAttention for b in dit.transformer_blocks)
    assert all(type(b.attn) is ParallelSelfAttention for b in dit.single_transformer_blocks)


@pytest.mark.parametrize("pack", PACKS, ids=["one", "two-references", "four-mixed", "three-references"])
def test_fused_equals_eager(eager_and_fused, pack):
    eager, fused = eager_and_fused
    items = _items(pack)
    for want, got in zip(_run(eager, items), _run(fused, items), strict=True):
        assert got.shape == want.shape
        # Only the q/k norms' reduction order moves (features in halves order): ulps apart.
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_fused_packed_items_equal_each_alone(eager_and_fused):
    _, fused = eager_and_fused
    items = _items(PACKS[2], seed=20)
    for item, got in zip(items, _run(fused, items), strict=True):
        (alone,) = _run(fused, [item])
        assert psnr_db(got, alone) >= 100  # bit-equal where the CPU's GEMM rows are independent


def test_fused_from_a_diffusers_folder_matches_diffusers(tiny_folder):
    """Users load diffusers' keys into the eager model; the fused modules are built from them."""
    folder, pipe = tiny_folder
    dit = optimize(build_dit(TINY.transformer, "cpu", torch.float32, model_path=str(folder)), True, False)
    item = make_item(5, 5, ((4, 4), (3, 7)), timestep=731.25, seed=5)
    (got,) = _run(dit, [item])
    assert psnr_db(got, diffusers_output(pipe.transformer, item)) >= 100


def test_fused_blocks_compile_once_for_one_item_and_once_for_packs():
    dit = optimize(build_dit(TINY.transformer, "cpu", torch.float32), fuse=True, kernels=False)
    attention = build_attention("torch", "cpu", torch.float32)
    packs = [PACKS[0], PACKS[0] * 2, PACKS[2], [(8, 8, (), 300.0)], PACKS[3]]
    with torch.inference_mode():
        eager = [dit(_items(pack), attention) for pack in packs]
        parts = compile_methods(
            dit, Flux2DiT.compiled_methods, "deterministic", "flux2.dit",
            persistent_rows=True, duck_shapes=False, backend=torch._dynamo.lookup_backend("aot_eager"),
        )  # fmt: skip
        compiled = [dit(_items(pack), attention) for pack in packs]
    (part,) = parts.parts
    assert part.num_compiles <= 2
    for want, got in zip(eager, compiled, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
