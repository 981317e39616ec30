"""Prefill steps that fit the largest decode CUDA graph replay one, each new token a decode row of
its own: a prefix-cache hit is one small step with no eager forward (whose launches, not its
math, set the time to first token of a small model on a GPU). On the CPU, through the fake
flashinfer (captured decode wrappers with their page-table capacity, SDPA inside) and graphs that
run, eagerly, the padded decode step they would replay."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mstar.engine.kv.attention import PagedHeads
from mstar.engine.kv.build import build_paged_attention
from mstar.llm import graphs as graphs_module
from mstar.llm.graphs import DecodeGraphs, default_graph_sizes, graph_page_indices
from mstar.llm.runner import ModelRunner
from tests.engine.attention_fakes import HOPPER
from tests.engine.paged_fakes import FakePagedFlashInfer
from tests.llm.engine import TINY, make_node, request, run, tiny_model

SIZES = [1, 2, 4, 8, 16]
SYSTEM = [3 + (7 * i) % 250 for i in range(40)]  # ten full pages of 4 tokens


class EagerDecodeGraphs(DecodeGraphs):
    """What a replay computes, run eagerly: the step planned into the captured wrapper of its
    size (padded with scratch rows), then the model over the padded inputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replayed = []  # the decode layouts replayed, in order
        self.num_prefill_replays = 0  # steps with prefill chunks among them

    def capture(self) -> None:
        self._graphs = dict.fromkeys(self.sizes)

    def graph_layout(self, layout):
        replayed = super().graph_layout(layout)
        self.num_prefill_replays += replayed is not None and layout.num_prefill > 0
        return replayed

    def run(self, layout, input_ids, positions):
        size = self.size_for(layout)
        self.replayed.append(layout)
        self.attention.plan(layout, graph_rows=size)
        padding = size - layout.num_segments
        return self.model.logits(
            self.model(F.pad(input_ids, (0, padding)), F.pad(positions, (0, padding)), self.attention)
        )


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def graph_node(model, overlap=False, **server_fields):
    """An LLM node whose runner replays (fake) decode graphs over a (fake) flashinfer backend."""
    node = make_node(model, overlap=overlap, **server_fields)
    pool = node.runner.attention.pool
    heads = PagedHeads(TINY.num_attention_heads, TINY.num_key_value_heads, TINY.head_dim, torch.float64,
                       pool.page_tokens, TINY.head_dim**-0.5)  # fmt: skip
    attention = build_paged_attention(
        pool, heads, "flashinfer", workspace=torch.zeros(1024, dtype=torch.uint8), cuda_graphs=True,
        max_graph_page_indices=graph_page_indices(pool.num_pages, pool.page_tokens, SIZES[-1]),
        libraries={"flashinfer": FakePagedFlashInfer()}, platform=HOPPER,
    )  # fmt: skip
    graphs = EagerDecodeGraphs(model, attention, SIZES)
    graphs.capture()
    node.runner = ModelRunner(model, attention, node.runner.sampler, graphs)
    return node, graphs


def test_a_prefix_cache_hit_is_one_small_step_replayed_as_a_graph(model):
    node, graphs = graph_node(model)
    miss, hit = (
        request(SYSTEM + [50, 51, 52], max_tokens=1),
        request(SYSTEM + [60, 61, 62, 63, 64], max_tokens=1),
    )
    run(node, [miss])
    assert graphs.replayed == []  # 43 new tokens: more than the largest graph holds, so eager
    steps_before = node.event_counts()["steps"]
    (hit_tokens,), (hit_pieces,), _ = run(node, [hit])
    assert node.event_counts()["steps"] == steps_before + 1  # one step: the tail, sampled in it
    assert node.event_counts()["prefix_cache_hits"] == len(SYSTEM)
    (replayed,) = graphs.replayed
    assert replayed.num_decode == 5 and replayed.kv_lens == (41, 42, 43, 44, 45)
    assert hit_pieces[0]["num_cached_tokens"] == len(SYSTEM) and hit_pieces[0]["token_ids"] == hit_tokens
    eager = make_node(model)
    (expected,), _, _ = run(eager, [hit])
    assert hit_tokens == expected  # what the eager prefill kernel gives


@pytest.mark.parametrize("overlap", [False, True])
def test_graph_replayed_prefills_give_the_eager_tokens(model, overlap):
    """Short prompts, prefix hits and decode rows in mixed steps, requests joining mid-flight."""
    prompts = [SYSTEM + [90, 91], [5, 9, 13], SYSTEM + [70, 71, 72, 73], [8] * 11, SYSTEM[:9]]
    requests = [request(prompt, max_tokens=6) for prompt in prompts]
    joins = [0, 1, 3, 4, 6]
    node, graphs = graph_node(model, overlap=overlap)
    outputs, pieces, _ = run(node, requests, joins)
    expected, expected_pieces, _ = run(make_node(model, overlap=overlap), requests, joins)
    assert outputs == expected and pieces == expected_pieces
    assert graphs.num_prefill_replays == 4  # every step with a prefill chunk but the first (42 tokens)


def test_prefill_steps_past_the_limits_run_eagerly(model, monkeypatch):
    """Too many new tokens for the largest graph, too many keys read as decode rows, or a page
    table past the captured wrapper's capacity: the step runs eagerly."""
    node, graphs = graph_node(model)
    run(node, [request(SYSTEM + [1], max_tokens=1)])  # warm the prefix cache
    run(node, [request([7] * 17, max_tokens=1)])
    assert graphs.replayed == []  # 17 tokens
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_PREFILL_KV_TOKENS", 2 * 41)
    run(node, [request(SYSTEM + [2, 3], max_tokens=1)])  # rows read 41 + 42 keys
    assert graphs.replayed == []
    run(node, [request(SYSTEM + [2, 3], max_tokens=3), request(SYSTEM + [8], max_tokens=1)], joins=[0, 2])
    assert len(graphs.replayed) == 2  # a decode row's 43 and 44 keys beside the second's 41
    graphs.replayed.clear()
    monkeypatch.setattr(graphs_module, "MAX_GRAPH_PREFILL_KV_TOKENS", 1 << 18)
    graphs.max_page_indices = 2 * 11 + 1  # two rows of 11 pages, and the padding row's scratch page
    run(node, [request(SYSTEM + [4, 5, 6], max_tokens=1)])  # three rows (4 with padding)
    assert graphs.replayed == []
    run(node, [request(SYSTEM + [4, 5], max_tokens=1)])
    assert len(graphs.replayed) == 1 and graphs.replayed[0].num_page_indices == 22


def test_graphs_hold_a_prefill_tail_even_where_few_sequences_run():
    assert default_graph_sizes(1, 8192) == [1, 2, 4, 8, *range(16, 129, 16)]  # c=1 serving too
    assert default_graph_sizes(1, 40)[-1] == 40  # no step is longer than 40 tokens
    assert default_graph_sizes(300, 8192)[-2:] == [256, 300]


def test_a_small_pool_still_replays_a_prefix_hit_tail(model):
    """The tail's rows each read the whole shared prefix, so its page table repeats the prefix's
    pages once a row: more entries than the pool has pages (a c=1 server's pool is sized for one
    context). The captured wrapper's table is sized for that, so the hit is still one replay."""
    node, graphs = graph_node(model, context_length=64, kv_pool_pages=20)
    run(node, [request(SYSTEM + [1], max_tokens=1)])
    run(node, [request(SYSTEM + [60, 61, 62, 63, 64], max_tokens=1)])
    (replayed,) = graphs.replayed
    assert replayed.num_page_indices > node.runner.attention.pool.num_pages + 1  # 5 rows of 11 pages
