"""Connection bounds for a front-facing HTTP server, on top of uvicorn's protocol.

uvicorn closes a connection left idle after a response (timeout_keep_alive), but not one that never
sends a request, one that stops in the middle of its headers, nor any number of them: 1000 silent
connections held 1000 descriptors, each forever. Here, per connection:
- over `max_connections` open: answered 503 (Retry-After) and closed at once;
- `idle_timeout_s` with no request under way (before the first one, between requests): closed;
- `header_timeout_s` from a request's first byte to the app receiving it: answered 408, closed.
The body's time is bounded where it is read (middleware.BodyLimitMiddleware, body_timeout_s).

"A request under way" is the app running for the connection: the protocol's `app` is wrapped,
which both of uvicorn's HTTP implementations (httptools, h11) call once a request's headers are in.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from mstar.api.errors import error_body


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    idle_timeout_s: float
    header_timeout_s: float


def raw_error_response(status: int, reason: str, message: str, code: str, headers: str = "") -> bytes:
    """A whole HTTP/1.1 error response in the API's error shape, closing the connection."""
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps(error_body(message, error_type, None, code), separators=(",", ":"))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        f"{headers}connection: close\r\n\r\n"
    )
    return (head + body).encode("latin-1")


TOO_MANY_CONNECTIONS = raw_error_response(
    503, "Service Unavailable", "Too many open connections; retry shortly.", "too_many_connections",
    headers="retry-after: 1\r\n",
)  # fmt: skip
HEADERS_TOO_SLOW = raw_error_response(
    408, "Request Timeout", "The request's headers did not arrive in time.", "request_timeout"
)


def guarded_protocol(limits: ConnectionLimits, base: type | None = None) -> type:
    """uvicorn's HTTP protocol (httptools where installed, else h11: `base`) with the bounds above;
    pass the class as uvicorn.Config(http=...)."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base

    class GuardedHTTPProtocol(base):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._deadline: asyncio.TimerHandle | None = None
            self._reading_head = False
            self._num_requests_in_app = 0  # pipelined requests may overlap by one
            self.app = self._tracked(self.app)

        def _tracked(self, app: Any) -> Any:
            async def tracked_app(scope: Any, receive: Any, send: Any) -> None:
                self._num_requests_in_app += 1
                self._reading_head = False
                self._disarm()
                try:
                    await app(scope, receive, send)
                finally:
                    self._num_requests_in_app -= 1
                    if self._num_requests_in_app == 0:
                        self._arm(limits.idle_timeout_s, None)

            return tracked_app

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                transport.write(TOO_MANY_CONNECTIONS)
                transport.close()
                return
            self._arm(limits.idle_timeout_s, None)

        def data_received(self, data: bytes) -> None:
            if self._num_requests_in_app == 0 and not self._reading_head:
                self._reading_head = True  # the first byte of a request: its headers' clock starts
                self._arm(limits.header_timeout_s, HEADERS_TOO_SLOW)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, delay_s: float, response: bytes | None) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self._deadline = self.loop.call_later(delay_s, self._expire, response)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, response: bytes | None) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            if response is not None:
                self.transport.write(response)
            self.transport.close()

    return GuardedHTTPProtocol
