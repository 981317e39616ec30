"""Paged attention on the GPU (bf16): FlashInfer (eager and CUDA-graph wrappers) and FA3 over
gathered pages against the torch reference, at Qwen3's head shapes; the boot check names what fails."""

import pytest
import torch

from mstar.engine.kv.attention import PagedHeads
from mstar.engine.kv.build import build_paged_attention
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVGeometry, KVPool
from tests.models.qwen3.test_qwen3_gpu import relative_error

pytestmark = pytest.mark.gpu
PAGE = 16
SHAPES = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}


def heads_of(name: str) -> PagedHeads:
    q, kv, dim = SHAPES[name]
    return PagedHeads(q, kv, dim, torch.bfloat16, PAGE, dim**-0.5)


def random_layout(num_decode: int, prefill: list[tuple[int, int]], generator) -> PagedLayout:
    """Decode rows with random lengths, then (cached, new) prefill chunks; pages shuffled."""
    q_lens, kv_lens = (
        [1] * num_decode,
        [int(torch.randint(1, 600, (1,), generator=generator)) for _ in range(num_decode)],
    )
    for cached, new in prefill:
        q_lens.append(new)
        kv_lens.append(cached + new)
    counts = [-(-n // PAGE) for n in kv_lens]
    order = torch.randperm(sum(counts), generator=generator).tolist()
    page_ids, start = [], 0
    for count in counts:
        page_ids.append(order[start : start + count])
        start += count
    return PagedLayout.build(q_lens, kv_lens, page_ids, PAGE)


def run_backend(name: str, heads: PagedHeads, layout: PagedLayout, graph_rows=None):
    generator = torch.Generator().manual_seed(1)
    pool = KVPool(KVGeometry(1, heads.num_kv_heads, heads.head_dim, heads.dtype, PAGE), 1024, "cuda")
    pool.cache.copy_(torch.randn(pool.cache.shape, generator=generator).to(pool.cache))
    q = torch.randn(layout.total_q, heads.num_q_heads, heads.head_dim, generator=generator).to(
        "cuda", heads.dtype
    )
    k, v = (
        torch.randn(layout.total_q, heads.num_kv_heads, heads.head_dim, generator=generator).to(
            "cuda", heads.dtype
        )
        for _ in range(2)
    )
    attention = build_paged_attention(pool, heads, name, cuda_graphs=graph_rows is not None)
    planned = attention.plan(layout, graph_rows=graph_rows)
    pad = planned.total_q - layout.total_q
    padded = [torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) for t in (q, k, v)]
    out = attention.forward(0, *padded)[: layout.total_q].float()  # stores the step's keys, attends
    from mstar.engine.kv.backends.torch_paged import TorchPagedBackend

    reference = TorchPagedBackend(pool.device, heads).make_wrapper(captured=False)
    reference.plan(layout)
    expected = reference.run_paged(q.float(), pool, 0)  # float32 over the same (bf16) pool
    return float((out - expected).norm() / expected.norm())


@pytest.mark.parametrize("model", list(SHAPES))
@pytest.mark.parametrize("backend", ["flashinfer", "fa3"])
def test_paged_backends_match_the_reference_on_mixed_steps(backend, model):
    pytest.importorskip("flashinfer" if backend == "flashinfer" else "fa3_fwd_interface")
    generator = torch.Generator().manual_seed(0)
    for num_decode, prefill in ((7, []), (0, [(0, 300)]), (5, [(48, 129), (0, 17), (200, 1000)])):
        layout = random_layout(num_decode, prefill, generator)
        assert run_backend(backend, heads_of(model), layout) < 2e-2


def test_flashinfer_cuda_graph_wrapper_matches_the_reference():
    pytest.importorskip("flashinfer")
    layout = random_layout(5, [], torch.Generator().manual_seed(2))
    assert run_backend("flashinfer", heads_of("qwen3-8b"), layout, graph_rows=8) < 2e-2


def test_decode_graph_replay_equals_eager_decode():
    pytest.importorskip("flashinfer")
    from mstar.llm.graphs import DecodeGraphs
    from mstar.models.qwen3.nodes import load_qwen3
    from tests.llm.engine import TINY

    config = TINY.with_changes(head_dim=128, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    model = load_qwen3(config, "cuda", torch.bfloat16)
    heads = PagedHeads(4, 2, 128, torch.bfloat16, PAGE, 128**-0.5)
    pool = KVPool(KVGeometry(config.num_hidden_layers, 2, 128, torch.bfloat16, PAGE), 64, "cuda")
    attention = build_paged_attention(pool, heads, "flashinfer", cuda_graphs=True)
    graphs = DecodeGraphs(model, attention, [1, 4])
    graphs.capture()
    layout = PagedLayout.build([1, 1, 1], [20, 5, 33], [[0, 1], [2], [3, 4, 5]], PAGE)
    ids = torch.tensor([3, 9, 27])
    positions = torch.from_numpy(layout.new_positions.copy())
    replayed = graphs.run(layout, ids.cuda(), positions.cuda())[:3].clone()
    attention.plan(layout)
    with torch.inference_mode():
        eager = model.logits(model(ids.cuda(), positions.cuda(), attention))
    assert float((replayed - eager).norm() / eager.norm()) < 1e-2


def test_a_prefill_tail_replayed_as_decode_rows_equals_the_eager_prefill():
    """A prefix-cache hit's tail (24 new tokens after 200 in the pool, and a decode row beside it)
    replayed in the decode graph of 32 rows gives the eager prefill's logits: both against a float32
    twin over a float32 copy of the pool, the replay no further off than the eager prefill's own bf16
    error allows (decode and prefill kernels round differently: 1.1e-2 apart on the H200)."""
    pytest.importorskip("flashinfer")
    from mstar.llm.graphs import DecodeGraphs
    from mstar.models.qwen3.nodes import load_qwen3
    from tests.llm.engine import TINY

    config = TINY.with_changes(head_dim=128, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    model = load_qwen3(config, "cuda", torch.bfloat16)
    heads = PagedHeads(4, 2, 128, torch.bfloat16, PAGE, 128**-0.5)
    # room for the rows' page table: each row lists its sequence's pages up to itself
    pool = KVPool(KVGeometry(config.num_hidden_layers, 2, 128, torch.bfloat16, PAGE), 512, "cuda")
    pool.cache.normal_(generator=torch.Generator("cuda").manual_seed(0))  # the cached prefix's keys
    twin = float32_twin(model, pool, config)  # copies the pool before the steps below write to it
    attention = build_paged_attention(pool, heads, "flashinfer", cuda_graphs=True)
    graphs = DecodeGraphs(model, attention, [1, 8, 32])
    graphs.capture()
    layout = PagedLayout.build([1, 24], [40, 224], [[0, 1, 2], list(range(3, 17))], PAGE)
    rows = graphs.graph_layout(layout)
    assert rows is not None and rows.num_decode == 25
    ids = torch.randint(0, config.vocab_size, (25,), generator=torch.Generator().manual_seed(1))
    positions = torch.from_numpy(layout.new_positions.copy())
    replayed = graphs.run(rows, ids.cuda(), positions.cuda())[:25].clone()
    attention.plan(layout)
    with torch.inference_mode():
        eager = model.logits(model(ids.cuda(), positions.cuda(), attention))
    expected = twin(layout, ids.cuda(), positions.cuda())
    eager_error = relative_error(eager, expected)
    assert relative_error(replayed, expected) <= max(1e-2, 1.5 * eager_error)


def float32_twin(model, pool, config):
    """run(layout, ids, positions) -> float32 logits of a float32 copy of `model` on the torch paged
    backend over a float32 copy of `pool` as it is now."""
    import copy

    heads = PagedHeads(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                       torch.float32, PAGE, config.head_dim**-0.5)  # fmt: skip
    geometry = KVGeometry(
        config.num_hidden_layers, config.num_key_value_heads, config.head_dim, torch.float32, PAGE
    )
    pool32 = KVPool(geometry, pool.num_pages, pool.device)
    pool32.cache.copy_(pool.cache.float())
    model32 = copy.deepcopy(model).float()
    attention = build_paged_attention(pool32, heads, "torch")

    @torch.inference_mode()
    def run(layout, ids, positions):
        attention.plan(layout)
        return model32.logits(model32(ids, positions, attention)).float()

    return run


@pytest.mark.parametrize("model", sorted(SHAPES))
def test_planning_a_graph_decode_step_does_not_wait_for_the_device(model):
    """The host plans step n + 1 while the device still runs step n: with the device held busy,
    planning a captured decode wrapper returns with that work still queued (no stream sync)."""
    heads = heads_of(model)
    pool = KVPool(KVGeometry(1, heads.num_kv_heads, heads.head_dim, heads.dtype, PAGE), 1024, "cuda")
    attention = build_paged_attention(pool, heads, "flashinfer", cuda_graphs=True)
    layouts = [random_layout(8, [], torch.Generator().manual_seed(seed)) for seed in range(3)]
    attention.plan(layouts[0], graph_rows=8)  # the wrapper's buffers exist from here on
    torch.cuda.synchronize()
    for layout in layouts[1:]:
        torch.cuda._sleep(2_000_000_000)  # about a second of device time, queued
        attention.plan(layout, graph_rows=8)
        assert not torch.cuda.current_stream().query(), "the plan waited for the device"
        torch.cuda.synchronize()
