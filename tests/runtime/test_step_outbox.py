"""StepOutbox: a step's small messages leave as one ZMQ message (one frame each) at the boundary;
anything else flushes them and leaves with them at once, in order, and so does a request's first
piece (the worker's rule: its client is waiting for it)."""

from __future__ import annotations

import uuid

import pytest
import zmq

from mstar.runtime import messages as m
from mstar.runtime.transport import StepOutbox, connect_push, receive
from mstar.runtime.worker import COALESCED, is_first_piece


@pytest.fixture
def pair():
    context = zmq.Context()
    endpoint = f"inproc://outbox-{uuid.uuid4().hex}"
    inbox = context.socket(zmq.PULL)
    inbox.bind(endpoint)
    push = connect_push(context, endpoint)
    yield StepOutbox(push, COALESCED), inbox
    push.close(linger=0)
    inbox.close(linger=0)
    context.term()


def next_message(inbox: zmq.Socket) -> list[m.Message]:
    assert inbox.poll(10_000), "nothing arrived"
    return [m.decode(frame) for frame in receive(inbox)]


def test_a_steps_pieces_leave_together_at_the_flush(pair):
    outbox, inbox = pair
    pieces = [m.InlinePiece(f"r{i}", "text", 0, {"token_ids": [i]}) for i in range(16)]
    for piece in pieces:
        outbox.send(piece)
    outbox.send(m.StepStats("llm", 16, 16, 0.001, 0.001))
    assert outbox.num_waiting == 17 and inbox.poll(0) == 0  # nothing left before the boundary
    outbox.flush()
    assert next_message(inbox) == [*pieces, m.StepStats("llm", 16, 16, 0.001, 0.001)]
    assert inbox.poll(50) == 0  # one ZMQ message for the whole step
    outbox.flush()  # nothing waiting: nothing sent
    assert inbox.poll(50) == 0


def test_an_ending_flushes_the_waiting_pieces_first(pair):
    outbox, inbox = pair
    piece = m.InlinePiece("r1", "text", 0, {"token_ids": [7]})
    error = m.RequestError("r2", "boom")
    outbox.send(piece)
    outbox.send(error)  # not coalesced: leaves now, after the piece queued before it
    assert outbox.num_waiting == 0
    assert next_message(inbox) == [piece, error]


def test_a_requests_first_piece_leaves_at_once_and_its_later_pieces_wait(pair):
    outbox, inbox = pair
    outbox = StepOutbox(outbox.socket, COALESCED, is_first_piece)  # as the worker builds it
    stats = m.StepStats("llm", 2, 2, 0.001, 0.001)
    later = m.InlinePiece("r1", "text", 4, {"token_ids": [3]})
    first = m.InlinePiece("r2", "text", 0, {"token_ids": [9]})
    outbox.send(stats)
    outbox.send(later)
    assert outbox.num_waiting == 2 and inbox.poll(0) == 0
    outbox.send(first)  # the step read r2's first token back: it leaves now, with what came before
    assert outbox.num_waiting == 0
    assert next_message(inbox) == [stats, later, first]
    outbox.send(m.InlinePiece("r2", "text", 1, {"token_ids": [4]}))
    assert outbox.num_waiting == 1
