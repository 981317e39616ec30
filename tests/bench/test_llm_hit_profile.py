"""The prefix-hit profile on the CPU: the API front's steps over a token-id body, and the node's
miss and hit (the hit's system prompt really cached), every timed part put back afterwards."""

from __future__ import annotations

from mstar.bench.llm_hit_profile import front_ms, node_ms
from mstar.engine.kv.pages import PageTable
from mstar.llm.runner import StagedInputs
from mstar.llm.sequence import Sequence
from tests.llm.engine import TINY, make_node, tiny_model

SHARED_METHODS = [(Sequence, "page_hashes"), (PageTable, "match_prefix"), (StagedInputs, "of")]


def test_front_times_each_api_step_of_a_token_id_body():
    result = front_ms(TINY.vocab_size, num_prompt=300, context_length=512, num_runs=2)
    assert set(result) == {"parse_json", "validate", "prompts", "check_prompt", "request", "encode", "total"}
    assert all(value >= 0 for value in result.values())


def test_node_times_a_miss_and_a_hit_and_restores_the_node():
    node = make_node(tiny_model())
    methods = {name: getattr(type(node), name) for name in ("prepare", "_launch", "_emit")}
    shared = {(owner, name): vars(owner)[name] for owner, name in SHARED_METHODS}
    result = node_ms(node, TINY.vocab_size, num_shared=40, num_own=5, num_runs=2)
    stats = node.scheduler.stats
    assert stats.prefix_cache_hits >= 5 * 40  # every hit (warmup ones too) found its 40 tokens cached
    for case in ("miss", "hit"):
        assert result[case]["first_token_ms"] >= result[case]["queue_ms"] >= 0
        assert {
            "prepare",
            "schedule",
            "plan.layout",
            "attention.plan",
            "samples.read",
            "stage inputs (one copy)",
        } <= set(result[case]["host_ms"])
    assert result["speedup"] > 0
    assert not {"prepare", "_launch", "_emit"} & set(vars(node))  # the class's methods again
    assert {name: getattr(type(node), name) for name in methods} == methods
    assert {(owner, name): vars(owner)[name] for owner, name in SHARED_METHODS} == shared
    assert not node.scheduler.num_sequences and node.scheduler.pages.stats().num_used == 0
