"""Slowloris-style connections against a real server (mstar.api.server.build_server: uvicorn with
the connection bounds): a connection that sends nothing, stops or trickles in its headers, or
stalls mid-body is closed once its bound passes, and connections over max_connections are refused.
Each test asserts that the close happens; the socket timeouts are only hang guards."""

from __future__ import annotations

import select
import socket
import time

import httpx
import pytest

from mstar.api.app import create_app
from mstar.api.metrics import PrometheusMetrics
from mstar.api.server import build_server
from mstar.config import ServerConfig
from tests.api.fakes import FakeImageSpec, FakeRuntime
from tests.api.live import LiveServer

HANG_GUARD_S = 30.0
IMAGES = b"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def _live(**config_fields) -> LiveServer:
    spec = FakeImageSpec()
    config = ServerConfig(model=spec.name, **config_fields)
    metrics = PrometheusMetrics(spec.name)
    app = create_app(config, spec, FakeRuntime(metrics=metrics), metrics=metrics)
    return LiveServer(app, build_server(app, config))


@pytest.fixture(scope="module")
def tight():
    with _live(idle_timeout_s=0.5, header_timeout_s=1.0, body_timeout_s=1.0) as live:
        yield live


def _connect(live: LiveServer) -> socket.socket:
    host, port = httpx.URL(live.base_url).host, httpx.URL(live.base_url).port
    sock = socket.create_connection((host, port), timeout=HANG_GUARD_S)
    sock.settimeout(HANG_GUARD_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket.timeout: it never did)."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_connection_that_sends_nothing_is_closed(tight):
    with _connect(tight) as sock:
        assert _read_until_closed(sock) == b""


def test_headers_that_stop_get_408_and_are_closed(tight):
    with _connect(tight) as sock:
        sock.sendall(IMAGES + b"Content-Type: application/json\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_trickled_headers_are_closed_at_the_header_bound(tight):
    """One header line every 0.2 s never idles long enough for the idle bound; the header bound
    counts from the request's first byte."""
    with _connect(tight) as sock:
        sock.sendall(IMAGES)
        deadline = time.monotonic() + HANG_GUARD_S
        while not select.select([sock], [], [], 0.2)[0]:
            assert time.monotonic() < deadline, "the trickling connection stayed open"
            sock.sendall(b"X-Pad: 1\r\n")
        assert _read_until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_body_that_stalls_gets_408_and_is_closed(tight):
    with _connect(tight) as sock:
        sock.sendall(
            IMAGES + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n" + b'{"prompt": '
        )
        response = _read_until_closed(sock)
    assert response.startswith(b"HTTP/1.1 408 ") and b'"code":"request_timeout"' in response


def test_keep_alive_connection_is_closed_when_idle_and_requests_still_work(tight):
    with _connect(tight) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        time.sleep(0.2)  # a slow client inside the bounds is served
        sock.sendall(b"\r\n")
        response = _read_until_closed(sock)  # then closed once idle
    assert response.startswith(b"HTTP/1.1 200 ") and response.count(b"HTTP/1.1") == 1
    body = {"prompt": "a 7", "num_inference_steps": 1}
    assert httpx.post(f"{tight.base_url}/v1/images/generations", json=body).status_code == 200


def test_connections_over_the_limit_are_refused_with_503():
    with _live(max_connections=4, idle_timeout_s=HANG_GUARD_S) as live:
        held = [_connect(live) for _ in range(4)]
        try:
            with _connect(live) as extra:
                refused = _read_until_closed(extra)
            assert refused.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in refused
            assert b'"code":"too_many_connections"' in refused
            held[0].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert held[0].recv(65536).startswith(b"HTTP/1.1 200 ")  # the ones held are served
            held.pop().close()
            deadline = time.monotonic() + HANG_GUARD_S
            while True:  # a slot frees once the server has seen the close
                with _connect(live) as again:
                    again.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    if _read_until_closed(again).startswith(b"HTTP/1.1 200 "):
                        break
                assert time.monotonic() < deadline, "the freed slot was never reused"
                time.sleep(0.05)
        finally:
            for sock in held:
                sock.close()
