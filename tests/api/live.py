"""A real uvicorn server on 127.0.0.1 (a free port) in a background thread, for end-to-end tests."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

STARTUP_TIMEOUT_S = 60.0


class LiveServer:
    """`server`: a uvicorn.Server to run instead of a plain one (mstar.api.server.build_server's,
    with the connection bounds), on a socket bound here."""

    def __init__(self, app, server: uvicorn.Server | None = None):
        sockets = None
        if server is None:
            config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
            server = uvicorn.Server(config)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets = [sock]
        self.server = server
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": sockets}, name="live-uvicorn", daemon=True
        )
        self.base_url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
