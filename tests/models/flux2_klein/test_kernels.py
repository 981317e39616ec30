"""optimize(kernels=True): the modules calling the hand-written ops (on the CPU the ops' PyTorch
definitions) give the fused model's outputs bit for bit in fp32, for one item and for packs of
requests with different sizes, timesteps and reference counts, and their stacks compile once for
one item and once for packs (aot_eager: inductor's graph passes without its kernels)."""

import copy

import pytest
import torch
import torch._dynamo

from mstar.engine.compile import compile_methods
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import Flux2DiT
from mstar.models.flux2_klein.kernel_blocks import (
    KernelDoubleStreamBlocks,
    KernelJointAttention,
    KernelParallelSelfAttention,
    KernelSingleStreamBlocks,
)
from mstar.models.flux2_klein.optimize import optimize
from mstar.models.flux2_klein.weights import build_dit
from tests.models.flux2_klein.test_optimize import PACKS, _items, _run


@pytest.fixture(scope="module")
def fused_and_kernels():
    eager = build_dit(TINY.transformer, "cpu", torch.float32, seed=7)
    fused = optimize(copy.deepcopy(eager), fuse=True, kernels=False)
    return fused, optimize(copy.deepcopy(eager), fuse=True, kernels=True)


def test_kernels_swap_the_attentions_and_stacks_and_keep_the_keys(fused_and_kernels):
    fused, kernels = fused_and_kernels
    assert isinstance(kernels.transformer_blocks, KernelDoubleStreamBlocks)
    assert isinstance(kernels.single_transformer_blocks, KernelSingleStreamBlocks)
    assert all(isinstance(b.attn, KernelJointAttention) for b in kernels.transformer_blocks)
    assert all(isinstance(b.attn, KernelParallelSelfAttention) for b in kernels.single_transformer_blocks)
    assert list(kernels.state_dict()) == list(fused.state_dict())


def test_kernels_need_fused_projections():
    with pytest.raises(ValueError, match="fuse=True"):
        optimize(build_dit(TINY.transformer, "cpu", torch.float32), fuse=False, kernels=True)


@pytest.mark.parametrize("pack", PACKS, ids=["one", "two-references", "four-mixed", "three-references"])
def test_kernel_model_equals_the_fused_model_bit_for_bit(fused_and_kernels, pack):
    """The ops' definitions do the fused model's arithmetic in fp32 (the modulation rows gathered
    per token inside the op instead of before it, the joint order of queries and keys built after
    their norms by one gather instead of a concatenation and a gather)."""
    fused, kernels = fused_and_kernels
    items = _items(pack, seed=3)
    for want, got in zip(_run(fused, items), _run(kernels, items), strict=True):
        assert torch.equal(got, want)


def test_kernel_stacks_compile_once_for_one_item_and_once_for_packs():
    dit = optimize(build_dit(TINY.transformer, "cpu", torch.float32, seed=1), fuse=True, kernels=True)
    packs = [PACKS[0], PACKS[0] * 2, PACKS[2], [(8, 8, (), 300.0)], PACKS[3]]
    eager = [_run(dit, _items(pack)) for pack in packs]
    with torch.inference_mode():
        parts = compile_methods(
            dit, Flux2DiT.compiled_methods, "deterministic", "flux2.dit",
            persistent_rows=True, duck_shapes=False, backend=torch._dynamo.lookup_backend("aot_eager"),
        )  # fmt: skip
    compiled = [_run(dit, _items(pack)) for pack in packs]
    (part,) = parts.parts
    assert part.num_compiles <= 2
    for want, got in zip(eager, compiled, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
