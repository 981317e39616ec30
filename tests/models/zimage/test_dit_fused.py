"""Fused projections of the Z-Image DiT: same output as unfused, no separate weights left, and the
fused layer stack traces as one dynamic graph (aot_eager, CPU)."""

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from mstar.engine.attention import build_attention
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import DiTInput
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
    fused = copy.deepcopy(unfused)
    fused.fuse_projections()
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
    assert fused.projections_fused and not unfused.projections_fused


def test_fused_layer_stack_compiles_once_without_graph_breaks(unfused_and_fused):
    """The main stack and the noise refiner (both compiled in serving) trace as one graph each."""
    _, eager = unfused_and_fused
    model = copy.deepcopy(eager)
    counters = [CompileCounterWithBackend("aot_eager") for _ in range(2)]
    model._run_layers = torch.compile(model._layer_stack, backend=counters[0], fullgraph=True, dynamic=True)
    model._run_noise_refiner = torch.compile(
        model._noise_refiner_stack, backend=counters[1], fullgraph=True, dynamic=True
    )
    # Two items each time: one item broadcasts its modulation row (a second graph by design).
    for sizes in ([(8, 8, 4), (6, 10, 9)], [(12, 8, 40), (8, 16, 3)]):
        items = _items(sizes, seed=len(sizes[0]))
        for want, got in zip(_run(eager, items), _run(model, items), strict=True):
            torch.testing.assert_close(got, want)
    for counter in counters:
        graphs = [graph for graph in counter.graphs if len(graph.graph.nodes) > 0]  # dynamo adds an empty one
        assert len(graphs) == 1  # a new pack length reuses the graph
