"""A request's first tokens leave in the step that reads them back, not after the next step's
launch: without overlap (CPU) the step is read at once; with overlap (GPUs) step n is read before
step n + 1 is queued whenever the device has already finished it (asked without a sync), and
after it otherwise (the device is busy: queueing first keeps it fed). Same tokens either way."""

from __future__ import annotations

import pytest

from mstar.graph import RequestState
from mstar.llm.sampling import PendingSamples
from tests.llm.engine import make_node, request, run, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def calls_of_one_request(node, max_tokens=3):
    """'launch' and 'piece' in the order the node did them, forward after forward until it stops."""
    calls = []
    launch = node.runner.launch

    def counted_launch(*args, **kwargs):
        calls.append("launch")
        return launch(*args, **kwargs)

    node.runner.launch = counted_launch
    state = RequestState("r0", request([5, 9, 13, 2, 7], max_tokens=max_tokens))
    state.emit_output = lambda key, piece: calls.append("piece")
    node.prepare(state)
    while not node.check_stop(state):
        node.forward([state])
        calls.append("|")  # a step boundary: what the worker sends leaves by here at the latest
    node.release(state)
    return calls


def test_without_overlap_each_step_sends_its_tokens_before_the_next_is_queued(model):
    calls = calls_of_one_request(make_node(model))
    assert calls == ["launch", "piece", "|"] * 3


def test_with_overlap_a_finished_step_is_read_before_the_next_is_queued(model, monkeypatch):
    monkeypatch.setattr(PendingSamples, "done", lambda pending: True)
    calls = calls_of_one_request(make_node(model, overlap=True))
    # the prefill is queued alone; its first token leaves before the first decode step is queued
    assert calls == ["launch", "|", "piece", "launch", "|", "piece", "launch", "|", "piece", "|"]


def test_with_overlap_a_busy_device_gets_the_next_step_first(model, monkeypatch):
    monkeypatch.setattr(PendingSamples, "done", lambda pending: False)
    calls = calls_of_one_request(make_node(model, overlap=True))
    assert calls == ["launch", "|", "launch", "piece", "|", "launch", "piece", "|", "piece", "|"]


@pytest.mark.parametrize("device_done", [False, True])
def test_either_order_gives_the_same_tokens_and_pieces(model, monkeypatch, device_done):
    monkeypatch.setattr(PendingSamples, "done", lambda pending: device_done)
    requests = [request([3 + i, 8, 1 + i], max_tokens=5 + i) for i in range(4)]
    joins = [0, 1, 1, 4]
    assert (
        run(make_node(model, overlap=True), requests, joins)[:2] == run(make_node(model), requests, joins)[:2]
    )


def test_the_first_piece_carries_the_workers_timeline(model):
    node = make_node(model)
    state = RequestState("r0", request([5, 9, 13], max_tokens=3))
    pieces = []
    state.emit_output = lambda key, piece: pieces.append(piece)
    node.prepare(state)
    while not node.check_stop(state):
        node.forward([state])
    timeline = pieces[0]["timeline"]
    assert timeline["prepared"] <= timeline["first_step"] <= timeline["first_token"]
    assert all("timeline" not in piece for piece in pieces[1:])
