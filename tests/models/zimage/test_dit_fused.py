"""optimize(): the Z-Image DiT's fused projections give the eager output, leave no separate weights
and trace as one dynamic graph each (aot_eager, CPU); its kernel modules give the fused output
exactly (on the CPU the ops are their PyTorch definitions)."""

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from mstar.engine.attention import build_attention
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import DiTInput
from mstar.models.zimage.optimize import (
    FusedSelfAttention,
    KernelModulatedBlocks,
    KernelSelfAttention,
    optimize,
)
from mstar.models.zimage.weights import build_dit

MAX_FUSED_RELATIVE_ERROR = 1e-6
SEPARATE_PROJECTIONS = ("to_q.", "to_k.", "to_v.", ".w1.", ".w3.")


def _items(sizes, seed=0) -> list[DiTInput]:
    """sizes: (latent height, latent width, caption tokens) per item."""
    generator = torch.Generator().manual_seed(seed)
    return [
        DiTInput(
            torch.randn(16, height, width, generator=generator),
            0.3 + 0.2 * index,
            torch.randn(num_text, TINY.dit.cap_feat_dim, generator=generator),
        )
        for index, (height, width, num_text) in enumerate(sizes)
    ]


def _run(model, items) -> list[torch.Tensor]:
    with torch.no_grad():
        return model(items, build_attention("torch", "cpu", torch.float32))


@pytest.fixture(scope="module")
def unfused_and_fused():
    unfused = build_dit(TINY.dit, "cpu", torch.float32, seed=3)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():  # norm weights of ones would hide a norm left in the wrong feature order
        for name, parameter in unfused.named_parameters():
            if name.endswith(("norm_q.weight", "norm_k.weight")):
                parameter.copy_(1 + 0.5 * torch.randn(parameter.shape, generator=generator))
    fused = optimize(copy.deepcopy(unfused), fuse=True, kernels=False)
    return unfused, fused


def test_fused_equals_unfused_and_drops_separate_projections(unfused_and_fused):
    unfused, fused = unfused_and_fused
    items = _items([(8, 12, 40), (16, 8, 5)])
    for want, got in zip(_run(unfused, items), _run(fused, items), strict=True):
        assert ((got - want).norm() / want.norm()).item() <= MAX_FUSED_RELATIVE_ERROR
    names = [name for name, _ in fused.named_parameters()]
    assert not [name for name in names if any(part in name for part in SEPARATE_PROJECTIONS)]
    for prefix in ("layers.0", "noise_refiner.0", "context_refiner.0"):
        assert f"{prefix}.attention.to_qkv.weight" in names
        assert f"{prefix}.feed_forward.w13.weight" in names
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in unfused.parameters())
    blocks = [*fused.noise_refiner, *fused.context_refiner, *fused.layers]
    assert all(type(block.attention) is FusedSelfAttention for block in blocks)


@pytest.mark.parametrize("qk_kernel", [False, True])
def test_fused_layer_stack_compiles_once_without_graph_breaks(unfused_and_fused, qk_kernel):
    """The main stack and the noise refiner (both compiled in serving) trace as one graph each."""
    unfused, eager = unfused_and_fused
    if qk_kernel:  # triton_ops: compile traces into them (on the CPU, their PyTorch definitions)
        eager = optimize(copy.deepcopy(unfused), fuse=True, kernels=True)
    model = copy.deepcopy(eager)
    counters = [CompileCounterWithBackend("aot_eager") for _ in range(2)]
    model.run_layers = torch.compile(model.run_layers, backend=counters[0], fullgraph=True, dynamic=True)
    model.run_noise_refiner = torch.compile(
        model.run_noise_refiner, backend=counters[1], fullgraph=True, dynamic=True
    )
    # Two items each time: one item broadcasts its modulation row (a second graph by design).
    for sizes in ([(8, 8, 4), (6, 10, 9)], [(12, 8, 40), (8, 16, 3)]):
        items = _items(sizes, seed=len(sizes[0]))
        for want, got in zip(_run(eager, items), _run(model, items), strict=True):
            torch.testing.assert_close(got, want)
    for counter in counters:
        graphs = [graph for graph in counter.graphs if len(graph.graph.nodes) > 0]  # dynamo adds an empty one
        assert len(graphs) == 1  # a new pack length reuses the graph


def test_rotary_on_halves_is_the_interleaved_rotation_reordered(unfused_and_fused):
    """Exactly: the same fp32 arithmetic per element, only the features' places differ."""
    from mstar.models.rotary import halves_order
    from mstar.models.zimage.dit_layers import apply_rotary
    from mstar.models.zimage.optimize import apply_rotary_halves

    num_heads, head_dim = 3, 8
    order = halves_order(num_heads, head_dim)
    x = torch.randn(5, num_heads * head_dim).bfloat16()
    angles = torch.randn(5, head_dim // 2)
    interleaved = apply_rotary(x.unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    halves = apply_rotary_halves(x[:, order].unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    assert torch.equal(halves.flatten(-2), interleaved.flatten(-2)[:, order])
    unfused, fused = unfused_and_fused
    # The per-head q norm's weight moved with its features.
    norm_weight = unfused.layers[0].attention.norm_q.weight
    head_order = halves_order(1, norm_weight.numel())
    assert torch.equal(fused.layers[0].attention.norm_q.weight, norm_weight[head_order])


def test_qk_kernel_op_gives_the_fused_output_and_needs_fused_projections(unfused_and_fused):
    """On the CPU the op runs its PyTorch definition, so the output is the fused model's exactly."""
    unfused, fused = unfused_and_fused
    with_kernel = copy.deepcopy(fused)
    blocks = [*with_kernel.noise_refiner, *with_kernel.context_refiner, *with_kernel.layers]
    for block in blocks:  # the q/k kernel alone, without the block kernels
        block.attention.__class__ = KernelSelfAttention
    items = _items([(8, 12, 40), (16, 8, 5)], seed=1)
    for want, got in zip(_run(fused, items), _run(with_kernel, items), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="fused projections"):
        optimize(copy.deepcopy(unfused), fuse=False, kernels=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernel_op_gives_the_blocks_output(unfused_and_fused, dtype):
    """On the CPU the op runs its PyTorch definition: the same output as the blocks' own code, in
    bf16 too (the same roundings in the same order); the next block's input is handed over."""
    unfused, _ = unfused_and_fused
    plain = optimize(copy.deepcopy(unfused).to(dtype), fuse=True, kernels=False)
    for block in [*plain.noise_refiner, *plain.context_refiner, *plain.layers]:
        block.attention.__class__ = KernelSelfAttention  # in both: the block kernels are what differs
    with_kernel = optimize(copy.deepcopy(unfused).to(dtype), fuse=True, kernels=True)
    assert isinstance(with_kernel.layers, KernelModulatedBlocks) and isinstance(
        with_kernel.noise_refiner, KernelModulatedBlocks
    )
    items = _items([(8, 12, 40), (16, 8, 5)], seed=2)
    items = [DiTInput(i.latents.to(dtype), i.timestep, i.caption.to(dtype)) for i in items]
    for want, got in zip(_run(plain, items), _run(with_kernel, items), strict=True):
        assert torch.equal(got, want)
    mixed_eps = copy.deepcopy(unfused)
    mixed_eps.layers[0].ffn_norm2.eps = 1e-3
    with pytest.raises(ValueError, match="share one eps"):
        optimize(mixed_eps, fuse=True, kernels=True)
