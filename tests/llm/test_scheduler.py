"""The continuous-batching scheduler, pure Python: queues in, a batch plan out (no model, no torch)."""

import pytest

from mstar.engine.kv.pages import PageTable
from mstar.llm.scheduler import Scheduler, SchedulerConfig
from mstar.llm.sequence import Sequence, Status

PAGE = 4


def make(num_pages=64, max_num_seqs=8, budget=64, prefix_cache=True):
    return Scheduler(SchedulerConfig(max_num_seqs, budget), PageTable(num_pages, PAGE, prefix_cache))


def seq(name, num_prompt, arrival, first_token=0):
    return Sequence.new(name, list(range(first_token, first_token + num_prompt)), arrival)


def step(scheduler, sample_token=7):
    """Schedule, pretend the model ran, append a token to every sequence that samples."""
    plan = scheduler.schedule()
    scheduler.computed(plan)
    for row in plan.rows:
        if row.samples:
            row.seq.append(sample_token)
    return plan


def test_decode_rows_come_first_then_prefill_chunks_under_the_budget():
    scheduler = make(budget=10)
    a = seq("a", 5, 0)
    scheduler.add(a)
    step(scheduler)  # a prefilled, sampled its first token
    b, c = seq("b", 7, 1, first_token=100), seq("c", 9, 2, first_token=200)
    scheduler.add(b)
    scheduler.add(c)
    plan = scheduler.schedule()
    assert [(r.seq.seq_id, r.start, r.num_tokens) for r in plan.rows] == [
        ("a", 5, 1),
        ("b", 0, 7),
        ("c", 0, 2),
    ]
    assert plan.num_decode == 1 and plan.num_tokens == 10
    assert [r.samples for r in plan.rows] == [True, True, False]  # c's prompt continues next step
    scheduler.computed(plan)
    a.append(1)
    b.append(1)
    plan = scheduler.schedule()
    assert [(r.seq.seq_id, r.start, r.num_tokens) for r in plan.rows] == [
        ("a", 6, 1),
        ("b", 7, 1),
        ("c", 2, 7),
    ]


def test_layout_of_a_plan_matches_its_rows():
    scheduler = make()
    scheduler.add(seq("a", 6, 0))
    plan = scheduler.schedule()
    layout = plan.layout(PAGE)
    assert layout.q_lens == (6,) and layout.kv_lens == (6,) and len(layout.page_ids[0]) == 2
    assert plan.input_ids() == list(range(6))


def test_max_num_seqs_caps_admission():
    scheduler = make(max_num_seqs=2)
    for index in range(3):
        scheduler.add(seq(f"s{index}", 3, index))
    plan = scheduler.schedule()
    assert [r.seq.seq_id for r in plan.rows] == ["s0", "s1"]
    assert [s.seq_id for s in scheduler.waiting] == ["s2"]


def test_the_newest_running_sequence_is_preempted_when_pages_run_out_and_recomputed_later():
    scheduler = make(num_pages=4, budget=64, prefix_cache=False)
    old, new = seq("old", 8, 0), seq("new", 7, 1)  # 2 pages each: the pool is full
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)
    assert scheduler.pages.num_available() == 0
    plan = scheduler.schedule()  # old's 9th token needs a third page: new must go
    assert plan.preempted == [new] and new.status == Status.WAITING
    assert new.pages == [] and new.num_computed == 0 and new.num_outputs == 1  # its token is kept
    assert [r.seq.seq_id for r in plan.rows] == ["old"]
    scheduler.computed(plan)
    scheduler.finish(old)
    plan = scheduler.schedule()  # new comes back: all 8 known tokens recomputed, then it samples
    assert [(r.seq.seq_id, r.start, r.num_tokens, r.samples) for r in plan.rows] == [("new", 0, 8, True)]
    assert scheduler.stats.num_preemptions == 1


def test_a_sequence_preempts_itself_when_it_is_the_newest():
    scheduler = make(num_pages=4, budget=64, prefix_cache=False)
    old, new = seq("old", 6, 0), seq("new", 8, 1, first_token=100)
    scheduler.add(old)
    scheduler.add(new)
    step(scheduler)  # 2 pages each: the pool is full
    plan = scheduler.schedule()  # old's 7th token fits its page; new's 9th needs a third page
    assert [r.seq.seq_id for r in plan.rows] == ["old"] and plan.preempted == [new]
    assert new.status == Status.WAITING and scheduler.pages.num_available() == 2


def test_prefix_cache_serves_full_pages_and_always_leaves_the_last_token():
    scheduler = make()
    first = seq("first", 10, 0)
    scheduler.add(first)
    step(scheduler)
    second = seq("second", 8, 1)  # same first 8 tokens: two full cached pages, but one is kept back
    scheduler.add(second)
    plan = scheduler.schedule()
    row = next(r for r in plan.rows if r.seq is second)
    assert (row.start, row.num_tokens) == (4, 4)  # page 0 from the cache, the last page recomputed
    assert second.pages[0] == first.pages[0] and second.num_cached_prompt == 4
    assert scheduler.stats.prefix_cache_queries == 18 and scheduler.stats.prefix_cache_hits == 4


def test_finish_gives_every_page_back():
    scheduler = make(num_pages=16)
    sequences = [seq(f"s{i}", 5 + i, i) for i in range(4)]
    for s in sequences:
        scheduler.add(s)
    for _ in range(3):
        step(scheduler)
    for s in sequences:
        scheduler.finish(s)
    stats = scheduler.pages.stats()
    assert stats.num_used == 0 and stats.num_free + stats.num_cached == 16
    assert scheduler.num_sequences == 0


def test_finishing_a_waiting_sequence_removes_it():
    scheduler = make(max_num_seqs=1)
    a, b = seq("a", 3, 0), seq("b", 3, 1)
    scheduler.add(a)
    scheduler.add(b)
    scheduler.schedule()
    scheduler.finish(b)
    assert scheduler.waiting == [] and b.status == Status.FINISHED


def test_a_prompt_that_can_never_fit_is_refused():
    scheduler = make(num_pages=2)
    with pytest.raises(ValueError, match="never fit"):
        scheduler.add(seq("huge", 9, 0))


def test_config_needs_room_for_every_decode_row():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32)
