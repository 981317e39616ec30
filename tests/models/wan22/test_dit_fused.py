"""Fused projections of the Wan DiT: same output as unfused, no separate weights left, and the
fused layer stack traces as one dynamic graph (aot_eager, CPU)."""

import copy
import dataclasses

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from mstar.engine.attention import build_attention
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT

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
    fused = copy.deepcopy(unfused)
    fused.fuse_projections()
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
    assert fused.projections_fused and not unfused.projections_fused


def test_fuse_is_idempotent(unfused_and_fused):
    _, fused = unfused_and_fused
    before = fused.blocks[0].attn1.to_qkv.weight
    fused.fuse_projections()
    assert fused.blocks[0].attn1.to_qkv.weight is before


@pytest.mark.parametrize("qk_kernel", [False, True])
def test_fused_layer_stack_compiles_once_without_graph_breaks(unfused_and_fused, qk_kernel):
    _, eager = unfused_and_fused
    model = copy.deepcopy(eager)
    if qk_kernel:  # triton_ops: compile traces into them (on the CPU, their PyTorch definitions)
        eager = copy.deepcopy(eager)
        for dit in (eager, model):
            dit.use_qk_kernel()
            dit.use_norm_kernel()
    counter = CompileCounterWithBackend("aot_eager")
    model._layers = torch.compile(model.run_layers, backend=counter, fullgraph=True, dynamic=True)
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
    from mstar.models.wan22.dit_layers import apply_rotary, apply_rotary_halves

    num_heads, head_dim = 3, 8
    order = halves_order(num_heads, head_dim)
    assert order[:head_dim].tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    x = torch.randn(5, num_heads * head_dim)
    angles = torch.randn(5, 1, head_dim // 2)
    interleaved = apply_rotary(x.unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    halves = apply_rotary_halves(x[:, order].unflatten(-1, (num_heads, head_dim)), angles.cos(), angles.sin())
    assert torch.equal(halves.flatten(-2), interleaved.flatten(-2)[:, order])
    _, fused = unfused_and_fused
    assert all(block.attn1.rotary_halves and not block.attn2.rotary_halves for block in fused.blocks)


def test_qk_kernel_op_gives_the_fused_output_and_needs_fused_projections(unfused_and_fused):
    """On the CPU the op runs its PyTorch definition, so the output is the fused model's exactly;
    the Triton kernel itself is checked against that definition in tests/engine."""
    unfused, fused = unfused_and_fused
    with_kernel = copy.deepcopy(fused)
    with_kernel.use_qk_kernel()
    assert all(block.attn1.qk_kernel and not block.attn2.qk_kernel for block in with_kernel.blocks)
    items = [_item(3, 2, 8, 8), _item(4, 1, 6, 10, text_len=5)]
    for want, got in zip(_run(fused, items), _run(with_kernel, items), strict=True):
        assert torch.equal(got, want)
    with pytest.raises(ValueError, match="fused self-attention projections"):
        copy.deepcopy(unfused).use_qk_kernel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernel_op_gives_the_models_output_exactly(unfused_and_fused, dtype):
    """Each block hands the next its normed, modulated input through mstar::residual_layer_norm,
    the last one the output head's: on the CPU (the op's PyTorch definition) the very same bytes,
    with the keep-in-fp32 parameters of a bf16 model as served."""
    _, fused = unfused_and_fused
    model = copy.deepcopy(fused).to(dtype)
    for name, parameter in model.named_parameters():
        if any(pattern in name for pattern in WanDiT.fp32_param_patterns):
            parameter.data = parameter.data.float()
    with_kernel = copy.deepcopy(model)
    with_kernel.use_norm_kernel()
    assert all(block.norm_kernel for block in with_kernel.blocks)
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
        model.use_norm_kernel()
