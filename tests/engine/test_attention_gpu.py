"""Every available backend against SDPA on the GPU (bf16), selection on Hopper, no host sync."""

from __future__ import annotations

import random

import pytest
import torch

from mstar.engine.attention import AttentionLayout, build_attention, reference_attention
from mstar.engine.attention.build import backend_candidates, relative_error
from mstar.engine.attention.platform import Libraries, detect_platform

pytestmark = pytest.mark.gpu

BACKENDS = ["fa3", "flashinfer", "torch"]
NUM_HEADS, HEAD_DIM = 4, 128
MAX_RELATIVE_ERROR = 1e-2
_built: dict[str, object] = {}


def attention_for(backend: str):
    """One RaggedAttention per backend for the module; skips a backend this machine cannot run."""
    if backend not in _built:
        platform = detect_platform(torch.device("cuda"))
        try:
            backend_candidates(backend, platform, Libraries())
        except ValueError as error:
            _built[backend] = error
        else:
            _built[backend] = build_attention(backend, "cuda", torch.bfloat16, workspace_mb=256)
    built = _built[backend]
    if isinstance(built, ValueError):
        pytest.skip(f"{backend} cannot run here: {built}")
    return built


def random_layouts() -> list[tuple[str, AttentionLayout]]:
    rng = random.Random(0)
    cases = []
    for num_segments in (1, 2, 4, 7):
        lens = [rng.randint(1, 700) for _ in range(num_segments)]
        cases.append(("self", AttentionLayout.self_attention(lens)))
        cases.append(("self", AttentionLayout.self_attention(lens, causal=True)))
        cases.append(("cross", AttentionLayout.cross_attention(lens, [rng.randint(1, 512) for _ in lens])))
    cases.append(("self", AttentionLayout.self_attention((4096, 37, 1500))))
    cases.append(("cross", AttentionLayout.cross_attention((4096, 1500), (512, 77))))
    return cases


def random_qkv(layout: AttentionLayout, seed: int):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def make(tokens: int) -> torch.Tensor:
        shape = (tokens, NUM_HEADS, HEAD_DIM)
        return torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)

    return make(layout.total_q), make(layout.total_kv), make(layout.total_kv)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", range(len(random_layouts())))
def test_backend_matches_sdpa(backend, case):
    attention = attention_for(backend)
    label, layout = random_layouts()[case]
    q, k, v = random_qkv(layout, seed=case)
    attention.plan(label, layout)
    out = attention.run(label, q, k, v)
    expected = reference_attention(q.float(), k.float(), v.float(), layout)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert relative_error(out.float(), expected) <= MAX_RELATIVE_ERROR


def test_auto_picks_fa3_on_hopper():
    platform = detect_platform(torch.device("cuda"))
    if not platform.is_hopper or Libraries().module("fa3") is None:
        pytest.skip("needs a Hopper GPU with fa3-fwd installed")
    assert build_attention("auto", "cuda", torch.bfloat16, workspace_mb=64).backend_name == "fa3"


@pytest.mark.parametrize("backend", BACKENDS)
def test_steady_state_step_does_not_sync(backend):
    attention = attention_for(backend)
    layouts = [AttentionLayout.self_attention((300, 200)), AttentionLayout.self_attention((100, 120, 90))]
    inputs = [random_qkv(layout, seed=index) for index, layout in enumerate(layouts)]
    for layout, qkv in zip(layouts, inputs, strict=True):  # warm: buffers sized, head shapes known
        attention.plan("sync", layout)
        attention.run("sync", *qkv)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for layout, qkv in zip(layouts * 2, inputs * 2, strict=True):  # hits, then misses below
            attention.plan("sync", layout)
            for _ in range(3):
                attention.run("sync", *qkv)
        attention.plan("sync", AttentionLayout.self_attention((250, 250)))  # a miss
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("backend", BACKENDS)
def test_captured_wrapper_replays_a_cuda_graph_after_replanning(backend):
    attention_for(backend)  # skips when unavailable
    attention = build_attention(
        backend, "cuda", torch.bfloat16, workspace_mb=64, cuda_graph=True, num_slots=1
    )
    first, second = AttentionLayout.self_attention((300, 200)), AttentionLayout.self_attention((200, 300))
    q, k, v = random_qkv(first, seed=1)
    attention.plan("self", first)
    attention.run("self", q, k, v)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention.run("self", q, k, v)
    attention.plan("self", second)  # same segment count and shapes: the graph's buffers are rewritten
    graph.replay()
    expected = reference_attention(q.float(), k.float(), v.float(), second)
    assert relative_error(out.float(), expected) <= MAX_RELATIVE_ERROR
