"""optimize(): the Wan DiT's fused projections give the eager output, leave no separate weights and
trace as one dynamic graph (aot_eager, CPU); its kernel modules give the fused output exactly (on
the CPU the ops are their PyTorch definitions)."""

import copy
import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from mstar.engine.attention import build_attention
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.optimize import FusedSelfAttention, KernelBlocks, KernelSelfAttention, optimize

MAX_FUSED_RELATIVE_ERROR = 1e-6
SEPARATE_PROJECTIONS = ("to_q.", "to_k.", "to_v.")


def _item(seed: int, frames: int, height: int, width: int, text_len: int = 12) -> DiTInput:
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(16, frames, height, width, generator=generator)
    return DiTInput(latents, 400.0 + seed, torch.randn(text_len, 16, generator=generator))


def _run(model: WanDiT, items: list[DiTInput]) -> list[torch.Tensor]:
    with torch.no_grad():
        return model(items, build_attention("torch", "cpu", torch.float32))


@pytest.fixture(scope="module")
def unfused_and_fused():
    torch.manual_seed(0)
    unfused = WanDiT(tiny_wan22_config().dit).eval()
    fused = optimize(copy.deepcopy(unfused), fuse=True, kernels=False)
    return unfused, fused


def test_fused_equals_unfused_and_drops_separate_projections(unfused_and_fused):
    unfused, fused = unfused_and_fused
    items = [_item(1, 2, 8, 8), _item(2, 3, 6, 10, text_len=7)]
    for want, got in zip(_run(unfused, items), _run(fused, items), strict=True):
        assert float((got - want).norm() / want.norm()) <= MAX_FUSED_RELATIVE_ERROR
    names = [name for name, _ in fused.named_parameters()]
    # Cross-attention queries come from other tokens than its keys/values: attn2.to_q stays.
    separate = [name for name in names if any(part in name for part in SEPARATE_PROJECTIONS)]
    assert separate == [
        f"blocks.{i}.attn2.to_q.{p}" for i in range(len(fused.blocks)) for p in ("weight", "bias")
    ]
    assert "blocks.0.attn1.to_qkv.weight" in names and "blocks.0.attn2.to_kv.weight" in names
    # Memory stays flat: the same number of parameter elements as before fusing.
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in unfused.parameters())
    assert all(type(block.attn1) is FusedSelfAttention for block in fused.blocks)
    assert [name for name, _ in fused.named_parameters() if "to_qkv" in name][
        0
    ] == "blocks.0.attn1.to_qkv.weight"


@pytest.mark.parametrize("qk_kernel", [False, True])
def test_fused_layer_stack_compiles_once_without_graph_breaks(unfused_and_fused, qk_kernel):
    unfused, eager = unfused_and_fused
    if qk_kernel:  # triton_ops: compile traces into them (on the CPU, their PyTorch definitions)
        eager = optimize(copy.deepcopy(unfused), fuse=True, kernels=True)
    model = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    model.run_layers = torch.compile(model.run_layers, backend=counter, fullgraph=True, dynamic=True)
    # Two items each time: one item has one modulation row (size 1 specialises: its own graph).
    # Text lengths avoid 24 (the tiny dim): duck sizing would tie the two and specialise.
    for items in (
        [_item(3, 2, 8, 8), _item(6, 1, 4, 4, text_len=9)],
        [_item(4, 1, 6, 6), _item(5, 3, 8, 10, text_len=5)],
    ):
        for want, got in zip(_run(eager, items), _run(model, items), strict=True):
            torch.testing.assert_close(got, want)
    graphs = [graph for graph in counter.graphs if len(graph.graph.nodes) > 0]  # dynamo adds an empty one
    assert len(graphs) == 1  # new pack and text lengths reuse the graph


def test_rotary_on_halves_is_the_interleaved_rotation_reordered(unfused_and_fused):
    from mstar.models.rotary import halves_order
    from mstar.models.wan22.dit_layers import apply_rotary
    from mstar.models.wan22.optimize import apply_rotary_halves

    num_heads, head_dim = 3, 8
    order = halves_order(num_heads, head_dim)
    assert order[:head_dim].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    x = torch.randn(5, num_heads * head_dim)
    angles = torch.randn(5, 1, head_dim // 2)
    interleaved = apply_rotary(x.unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    halves = apply_rotary_halves(x[:, order].unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    assert torch.equal(halves.flatten(-2), interleaved.flatten(-2)[:, order])


def test_qk_kernel_op_gives_the_fused_output_and_needs_fused_projections(unfused_and_fused):
    """On the CPU the op runs its PyTorch definition, so the output is the fused model's exactly;
    the Triton kernel itself is checked against that definition in tests/engine."""
    unfused, fused = unfused_and_fused
    with_kernel = copy.deepcopy(fused)
    for block in with_kernel.blocks:  # the q/k kernel alone, without the block kernel
        block.attn1.__class__ = KernelSelfAttention
    items = [_item(3, 2, 8, 8), _item(4, 1, 6, 10, text_len=5)]
    for want, got in zip(_run(fused, items), _run(with_kernel, items), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="fused projections"):
        optimize(copy.deepcopy(unfused), fuse=False, kernels=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernel_op_gives_the_models_output_exactly(unfused_and_fused, dtype):
    """Each block hands the next its normed, modulated input through mstar::residual_layer_norm,
    the last one the output head's: on the CPU (the op's PyTorch definition) the very same bytes,
    with the keep-in-fp32 parameters of a bf16 model as served."""
    unfused, _ = unfused_and_fused
    base = copy.deepcopy(unfused).to(dtype)
    for name, parameter in base.named_parameters():
        if any(pattern in name for pattern in WanDiT.fp32_param_patterns):
            parameter.data = parameter.data.float()
    model = optimize(copy.deepcopy(base), fuse=True, kernels=False)
    for block in model.blocks:  # the q/k kernel in both: the block kernel is what differs
        block.attn1.__class__ = KernelSelfAttention
    with_kernel = optimize(copy.deepcopy(base), fuse=True, kernels=True)
    assert isinstance(with_kernel.blocks, KernelBlocks)
    items = [_item(7, 2, 8, 8), _item(8, 1, 6, 10, text_len=5)]
    with torch.no_grad():
        want = model(items, build_attention("torch", "cpu", dtype))
        got = with_kernel(items, build_attention("torch", "cpu", dtype))
    for ours, theirs in zip(got, want, strict=True):
        assert torch.equal(ours, theirs)


def test_norm_kernel_needs_the_cross_attention_norm():
    config = tiny_wan22_config().dit
    model = WanDiT(dataclasses.replace(config, cross_attn_norm=False))
    with pytest.raises(ValueError, match="cross-attention norm"):
        optimize(model, fuse=True, kernels=True)
