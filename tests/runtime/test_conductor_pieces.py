"""The conductor's side of output pieces, in-process with a pool that only records what it is sent:
pieces joined in order for callers that take outputs whole, streamed as events to those that asked,
and a request failed (never finished with a partial output) when pieces are missing or out of order."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mstar.config import ServerConfig
from mstar.runtime import messages as m
from mstar.runtime.conductor import Conductor
from mstar.runtime.events import Done, Failed, Piece
from mstar.runtime.metrics import NullMetrics
from mstar.runtime.shm import SegmentStore
from tests.runtime.fake_models import FakeParams, FakeSpec


class RecordingPool:
    all_up = True
    peers_settled = True
    any_stalled = False

    def __init__(self):
        self.sent: list[tuple[int, m.Message]] = []

    def is_up(self, index: int) -> bool:
        return True

    def send(self, index: int, message: m.Message) -> bool:
        self.sent.append((index, message))
        return True

    def broadcast(self, message: m.Message) -> None:
        self.sent.append((-1, message))


@pytest.fixture
def setup(tmp_path):
    store = SegmentStore(str(tmp_path), "test-")
    owner = dict.fromkeys(FakeSpec.node_names, 0)
    conductor = Conductor(ServerConfig(), FakeSpec(), owner, RecordingPool(), store, NullMetrics())
    return conductor, store


def _to_final_walk(conductor: Conductor, rid: str) -> None:
    conductor.handle_message(m.WalkDone(rid, "encode", 0))  # the next walk, "generate", is the last


def _frames(value: int, num_frames: int = 2) -> np.ndarray:
    return np.full((num_frames, 2, 2, 3), value, dtype=np.uint8)


def _events(handle) -> list:
    async def collect():
        return [event async for event in handle.events()]

    return asyncio.run(collect())


def test_pieces_are_joined_for_a_caller_that_takes_outputs_whole(setup):
    conductor, store = setup
    handle = conductor.submit(FakeParams(seed=1), None, None, "whole")
    _to_final_walk(conductor, "1")
    for index in range(3):
        conductor.handle_message(m.OutputPiece("1", index, store.write("1", "frames", _frames(index))))
    conductor.handle_message(m.WalkDone("1", "generate", 0, [], {"frames": 3}))
    (done,) = _events(handle)
    assert isinstance(done, Done)
    np.testing.assert_array_equal(done.outputs["frames"], np.concatenate([_frames(i) for i in range(3)]))
    assert store.list_segments() == []


def test_a_streaming_caller_gets_the_pieces_as_events(setup):
    conductor, store = setup
    handle = conductor.submit(FakeParams(seed=1), None, None, "streamed", frozenset({"frames"}))
    _to_final_walk(conductor, "1")
    for index in range(2):
        conductor.handle_message(m.OutputPiece("1", index, store.write("1", "frames", _frames(index))))
    conductor.handle_message(m.WalkDone("1", "generate", 0, [], {"frames": 2}))
    events = _events(handle)
    assert [(type(e), getattr(e, "index", None)) for e in events] == [(Piece, 0), (Piece, 1), (Done, None)]
    assert events[-1].outputs == {}  # the frames went out as pieces


@pytest.mark.parametrize("problem", ["missing", "out_of_order"])
def test_missing_or_reordered_pieces_fail_the_request(setup, problem):
    conductor, store = setup
    handle = conductor.submit(FakeParams(seed=1), None, None, "broken")
    _to_final_walk(conductor, "1")
    indices = [0, 2] if problem == "out_of_order" else [0, 1]
    for index in indices:
        conductor.handle_message(m.OutputPiece("1", index, store.write("1", "frames", _frames(index))))
    conductor.handle_message(m.WalkDone("1", "generate", 0, [], {"frames": 3}))
    (failed,) = _events(handle)
    assert isinstance(failed, Failed) and "could not read outputs" in failed.message
    assert ("out of order" if problem == "out_of_order" else "were sent") in failed.message
    late = store.write("1", "frames", _frames(9))
    conductor.handle_message(m.OutputPiece("1", 3, late))  # after the end: dropped and unlinked
    assert store.list_segments() == []
