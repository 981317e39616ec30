"""The caller's side of one request: an event stream ending in exactly one Done or Failed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from mstar.errors import RequestFailed
from mstar.runtime.events import Done, Event, Failed


class RequestHandle:
    """Created by Runtime.submit. `events()` is for one consumer; `result()` may be awaited by any."""

    def __init__(self, request_id: str, stream_outputs: frozenset[str] = frozenset()):
        self.request_id = request_id
        self.stream_outputs = stream_outputs  # outputs this caller takes as Piece events
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._final: Done | Failed | None = None
        self._finished = asyncio.Event()

    @property
    def final(self) -> Done | Failed | None:
        return self._final

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Done | Failed):
                return

    async def result(self) -> dict[str, np.ndarray]:
        await self._finished.wait()
        if isinstance(self._final, Done):
            return self._final.outputs
        raise RequestFailed(self._final.message, kind=self._final.kind)

    # ---- runtime side --------------------------------------------------------------------

    def push(self, event: Event) -> None:
        if self._final is None:
            self._events.put_nowait(event)

    def finish(self, event: Done | Failed) -> bool:
        if self._final is not None:
            return False
        self._final = event
        self._events.put_nowait(event)
        self._finished.set()
        return True
