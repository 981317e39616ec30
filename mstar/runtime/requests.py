"""What a worker holds per request, and the window of recently ended requests."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from mstar.graph import RequestState
from mstar.params import RequestParams
from mstar.runtime import messages as m

MAX_REMEMBERED_RELEASES = 65536


@dataclass
class WorkerRequest:
    rid: str
    state: RequestState
    walk: str = ""  # the walk in progress here ("" between walks)
    stage_index: int = 0
    next_worker: int = m.CONDUCTOR  # where the walk's outputs go when it ends
    parts_pending: int = 0  # Parallel stage: parts (local nodes, forks) still running
    fork_lead: int | None = None  # set while this worker runs a fork for another worker
    forked_inputs: dict[str, Any] = field(default_factory=dict)
    stash_arrived: bool = False
    pending_run: m.RunWalk | None = None  # a walk waiting for the previous walk's outputs
    prepared: set[str] = field(default_factory=set)  # nodes whose prepare ran (to release)


class RequestTable:
    """Live requests by rid. Ended rids are remembered so late messages about them are dropped."""

    def __init__(self, on_release: Callable[[WorkerRequest], None], released: Iterable[str] = ()):
        self._requests: dict[str, WorkerRequest] = {}
        self._on_release = on_release
        self._released_order: deque[str] = deque()
        self._released: set[str] = set()
        for rid in released:
            self._remember(rid)

    def __len__(self) -> int:
        return len(self._requests)

    def rids(self) -> list[str]:
        return list(self._requests)

    def get(self, rid: str) -> WorkerRequest:
        return self._requests[rid]

    def was_released(self, rid: str) -> bool:
        return rid in self._released

    def get_or_create(self, rid: str, request_id: str, params: Callable[[], RequestParams]) -> WorkerRequest:
        """The request's entry, made with its params (decoded only for a new one) on first sight."""
        request = self._requests.get(rid)
        if request is None:
            request = WorkerRequest(rid, RequestState(request_id, params()))
            self._requests[rid] = request
        return request

    def release(self, rid: str) -> None:
        """Drop the request and every node's state for it (finish, failure, abort, timeout)."""
        self._remember(rid)
        request = self._requests.pop(rid, None)
        if request is None:
            return
        self._on_release(request)
        request.state.tensors.clear()
        request.state.state.clear()
        request.forked_inputs.clear()

    def _remember(self, rid: str) -> None:
        if rid in self._released:
            return
        self._released.add(rid)
        self._released_order.append(rid)
        if len(self._released_order) > MAX_REMEMBERED_RELEASES:
            self._released.discard(self._released_order.popleft())
