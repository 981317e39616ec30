"""Host and Origin checks: which names a request may address the server by, and which pages may
send it state-changing requests.

A server on loopback is reachable from every web page the machine's browser opens. Two attacks
follow: DNS rebinding (evil.example resolves to 127.0.0.1, so its scripts talk to us with
`Host: evil.example`) and cross-site requests (a form on evil.example POSTs to 127.0.0.1, carrying
`Origin: https://evil.example`). The Host check refuses the first (400), the Origin check the
second (403), before any other middleware or route runs.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from mstar.api.errors import ApiError, error_response

STATE_CHANGING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
DEFAULT_PORTS = {"http": "80", "https": "443"}
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def split_host(value: str) -> tuple[str, str]:
    """'Name:port' -> ('name', 'port'), lowercased, without a trailing dot; IPv6 keeps brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else ""
    else:
        name, _, port = value.partition(":")
    return name.rstrip("."), port


def is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Bound to loopback: loopback names only, plus allowed_hosts and public_url's host. Bound
    elsewhere: any name unless allowed_hosts lists some. "*" in allowed_hosts: any name;
    "*.example.com": its subdomains."""

    def __init__(self, bind_host: str, allowed_hosts: list[str], public_url: str | None = None):
        listed = [host for host in allowed_hosts if host != "*"]
        if public_url:
            listed.append(split_host(urlsplit(public_url).netloc)[0])
        self.names = frozenset(host for host in listed if not host.startswith("*."))
        self.suffixes = tuple(host[1:] for host in listed if host.startswith("*."))  # ".example.com"
        self.any_host = "*" in allowed_hosts or (not allowed_hosts and not is_loopback(bind_host))
        self.bind_name = "" if bind_host in WILDCARD_BINDS else split_host(bind_host)[0]

    def allows_host(self, name: str) -> bool:
        return self.any_host or is_loopback(name) or name == self.bind_name or self._listed(name)

    def allows_origin(self, origin: str, host: str) -> bool:
        """The page that sent the request: the server's own origin (the Host it was sent to), or
        one whose host is listed by name (allowed_hosts, public_url; not "*", not the bound
        address: another port there is another site). "null" (sandboxed frames, files) never."""
        parts = urlsplit(origin.strip())
        if parts.scheme not in DEFAULT_PORTS or not parts.netloc:
            return False
        name, port = split_host(parts.netloc)
        host_name, host_port = split_host(host)
        default_port = DEFAULT_PORTS[parts.scheme]
        if (name, port or default_port) == (host_name, host_port or default_port):
            return True
        return self._listed(name)

    def _listed(self, name: str) -> bool:
        return name in self.names or (bool(self.suffixes) and name.endswith(self.suffixes))


class HostOriginMiddleware:
    """400 `invalid_host` for a Host header the policy refuses; 403 `cross_origin_request` for a
    state-changing request whose Origin header names another site."""

    def __init__(self, app: ASGIApp, policy: HostPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> ApiError | None:
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if host and not self.policy.allows_host(split_host(host)[0]):
            return ApiError(
                400,
                "The Host header names a host this server does not answer to (see allowed_hosts).",
                code="invalid_host",
            )
        origin = headers.get(b"origin")
        is_state_change = scope["method"] in STATE_CHANGING_METHODS
        if (
            is_state_change
            and origin is not None
            and not self.policy.allows_origin(origin.decode("latin-1"), host)
        ):
            return ApiError(
                403,
                "Cross-site request refused: the Origin header names another site.",
                code="cross_origin_request",
            )
        return None
