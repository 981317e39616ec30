"""Step durations as the device ran them.

On a GPU a forward is queued, not waited for, so the host's wall time around it measures only the
queueing (a step loop that never syncs runs ahead of the device). With CUDA in use, a pair of
events brackets each forward and the duration is read once the end event has completed: polled,
never waited on. Without CUDA (CPU workers) the host's wall time is the step's time.

The loop may run ahead of the device by at most `max_in_flight` steps (`bound_in_flight`): the host
builds step N+1 while step N runs, so the device never waits for the host, yet requests still join,
leave and abort between steps at the pace the device runs them.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any


def _cuda_in_use() -> Any:
    """torch, when this process has initialised CUDA (the runtime never initialises it itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch


class StepTimer:
    def __init__(self) -> None:
        self._pending: deque[tuple[Any, Any, Any]] = deque()  # (payload, begin event, end event)
        self._done: list[tuple[Any, float]] = []

    def start(self) -> tuple[str, Any]:
        torch = _cuda_in_use()
        if torch is None:
            return "host", time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        return "cuda", begin

    def stop(self, token: tuple[str, Any], payload: Any) -> None:
        kind, begin = token
        if kind == "host":
            self._done.append((payload, time.perf_counter() - begin))
            return
        end = type(begin)(enable_timing=True)
        end.record()
        self._pending.append((payload, begin, end))

    def collect(self) -> list[tuple[Any, float]]:
        """(payload, seconds) of every step whose duration is known by now, in step order."""
        done, self._done = self._done, []
        while self._pending and self._pending[0][2].query():
            payload, begin, end = self._pending.popleft()
            done.append((payload, begin.elapsed_time(end) / 1000))
        return done

    def bound_in_flight(self, max_in_flight: int) -> None:
        """Wait (on the oldest queued steps only) until at most `max_in_flight` are unfinished."""
        while len(self._pending) > max_in_flight:
            payload, begin, end = self._pending.popleft()
            end.synchronize()
            self._done.append((payload, begin.elapsed_time(end) / 1000))

    @property
    def num_pending(self) -> int:
        return len(self._pending)
