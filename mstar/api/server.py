"""The HTTP server around the app for `mstar serve`: uvicorn with the connection bounds, and a
bounded graceful stop on SIGTERM (docker, systemd, Kubernetes) or SIGINT (Ctrl-C).

On the signal uvicorn stops accepting and waits for the connections in flight; the runtime gives
their requests `shutdown_grace_s` to finish and then fails the rest (503 `shutting_down`), so every
client gets an answer before uvicorn's own wait (grace + SHUTDOWN_ANSWER_S) runs out. Then the
workers are told to stop, their sockets and shared-memory segments are removed, and the process
exits 0.

uvicorn handles the signal while it serves and, once serve() returns, raises it again for the
handler that was there before: SIGTERM's default would kill the process before the runtime shut
down (workers and /tmp/mstar-* sockets left behind), asyncio's SIGINT handler would cancel the
shutdown. `StopSignals` is that handler: it records the signal instead.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

from mstar.api.connections import ConnectionLimits, guarded_protocol

log = logging.getLogger("mstar.api")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_ANSWER_S = 5.0  # after the grace: for the failed requests' error responses to go out
POLL_S = 0.05


def build_server(app: Any, config: Any) -> Any:
    """A uvicorn.Server for `app` with the config's connection bounds and shutdown grace."""
    import uvicorn

    limits = ConnectionLimits(config.max_connections, config.idle_timeout_s, config.header_timeout_s)
    return uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            http=guarded_protocol(limits),
            ws="none",  # no websocket routes: upgrades are not handed to an unguarded protocol
            timeout_keep_alive=config.idle_timeout_s,
            timeout_graceful_shutdown=config.shutdown_grace_s + SHUTDOWN_ANSWER_S,
        )
    )


class StopSignals:
    """SIGTERM and SIGINT handlers for the life of `mstar serve` (main thread only; elsewhere a
    no-op). During the boot a signal cancels the task that entered; once `server` is set it only
    asks the server to exit, which is a no-op after uvicorn's own handling (see the module doc)."""

    def __init__(self) -> None:
        self.server: Any = None
        self.stopped_during_boot = False
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.server is not None:
            self.server.should_exit = True
        elif not self.stopped_during_boot:
            self.stopped_during_boot = True
            self._loop.call_soon_threadsafe(self._task.cancel)


async def drain_when_stopping(server: Any, runtime: Any, grace_s: float) -> None:
    """Once uvicorn begins to stop, give the runtime's requests grace_s, then fail the rest."""
    while not server.should_exit:
        await asyncio.sleep(POLL_S)
    stats = runtime.stats()
    log.warning(
        "stopping: %d running request(s) get up to %g s, %d waiting one(s) are refused",
        stats.num_running,
        grace_s,
        stats.num_waiting,
    )
    await runtime.drain(0.0 if server.force_exit else grace_s)


async def serve_until_stopped(
    app: Any,
    config: Any,
    runtime: Any,
    sock: socket.socket,
    signals: StopSignals,
    on_started: Callable[[], None] = lambda: None,
) -> None:
    """Serve `app` on `sock` until a stop signal, then drain and shut the runtime down."""
    server = build_server(app, config)
    signals.server = server

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(POLL_S)
        on_started()

    tasks = [
        asyncio.create_task(announce()),
        asyncio.create_task(drain_when_stopping(server, runtime, config.shutdown_grace_s)),
    ]
    try:
        await server.serve(sockets=[sock])
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runtime.shutdown(timeout_s=0.0)  # uvicorn waited for the clients: nobody waits for the rest
