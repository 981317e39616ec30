"""The batch planner as plain data: queues in, batches out (no processes, no nodes, no tensors)."""

from mstar.runtime.batch_planner import Candidate, NodeQueue, plan_batches


def candidates(*rows):
    return [Candidate(rid, key, cost) for rid, key, cost in rows]


def test_one_batch_per_key_in_the_order_keys_first_appear():
    rows = [("a", "x", 1), ("b", "y", 1), ("c", "x", 1), ("d", "z", 1), ("e", "y", 1)]
    assert plan_batches(candidates(*rows), 8, None) == [["a", "c"], ["b", "e"], ["d"]]


def test_size_cap_leaves_the_youngest_waiting():
    rows = [(f"r{i}", "k", 1) for i in range(6)]
    assert plan_batches(candidates(*rows), 4, None) == [["r0", "r1", "r2", "r3"]]


def test_cost_cap_skips_what_does_not_fit_and_takes_later_requests_that_do():
    rows = [("a", "k", 5), ("big", "k", 6), ("small", "k", 3), ("more", "k", 1)]
    assert plan_batches(candidates(*rows), 8, 8) == [["a", "small"]]


def test_a_request_alone_always_fits_its_batch():
    assert plan_batches(candidates(("huge", "k", 100), ("b", "k", 1)), 8, 10) == [["huge"]]


def test_zero_batch_size_still_runs_one_request():
    assert plan_batches(candidates(("a", "k", 1), ("b", "k", 1)), 0, None) == [["a"]]


def test_queue_keeps_arrival_order_and_loop_members_take_turns():
    queue = NodeQueue()
    for rid in ("a", "b", "c"):
        queue.add(rid)
    queue.to_back("a")  # a denoised one step: behind the requests that waited
    assert list(queue) == ["b", "c", "a"] and "a" in queue
    queue.discard("c")
    queue.discard("never there")
    assert list(queue) == ["b", "a"]
    rows = [(rid, "k", 3) for rid in queue]
    assert plan_batches(candidates(*rows), 8, 3) == [["b"]]  # the older one first, under the cap


def test_requests_not_ready_wait_without_holding_a_place():
    rows = [Candidate("loading", "k", 5, ready=False), Candidate("a", "k", 5), Candidate("b", "k", 3)]
    assert plan_batches(rows, 2, 8) == [["a", "b"]]
