"""Wakes a worker's idle poll from another thread.

A node whose readiness changes off the step loop (an adapter finished loading on its loader thread)
calls `wake`; the worker polls the waker's pipe next to its inbox, so the step loop runs at once
instead of at the idle poll's timeout. One byte in the pipe is enough: a full pipe means a wake
is pending already.
"""

from __future__ import annotations

import contextlib
import os
import threading


class Waker:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()  # a wake never writes to a closed (maybe reused) descriptor
        self._closed = False

    def fileno(self) -> int:
        """The end to poll (readable once woken, until `clear`)."""
        return self._read

    def wake(self) -> None:
        """From any thread: make the next (or the current) poll return."""
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full: a wake is pending already
                os.write(self._write, b"\0")

    def clear(self) -> None:
        """On the polling thread, before it looks for work: wakes until now are seen by that look,
        later ones end its next poll."""
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)
