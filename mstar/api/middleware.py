"""ASGI middleware: the API key guard and the request body size limit, plus body parsing.

Both guards answer before any route runs; the body limit counts the bytes actually received, so a
chunked upload without Content-Length is bounded too.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mstar.api.errors import ApiError, error_response
from mstar.api.json_body import parse_json_object

GUARDED_PREFIXES = ("/v1/", "/generate")
# The openai client sends nested form values as `field[key]` (e.g. input_reference[image_url]).
NESTED_FORM_KEY = re.compile(r"^(\w+)\[(\w+)\]$")
MAX_FORM_FIELDS = 64


def _is_guarded(path: str) -> bool:
    return path == "/v1" or any(path.startswith(prefix) for prefix in GUARDED_PREFIXES)


async def _send_error(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
    await error_response(error)(scope, receive, send)


class ApiKeyMiddleware:
    """`Authorization: Bearer <key>` on every /v1 and /generate route, compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str | None):
        self.app = app
        self.expected = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.expected is None or scope["type"] != "http" or not _is_guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        # The scheme is case-insensitive (RFC 9110); the token is compared in constant time.
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.expected):
            error = ApiError(
                401,
                "Missing or invalid API key (send 'Authorization: Bearer <key>').",
                type="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await _send_error(scope, receive, send, error)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reads the whole body (at most max_body_bytes, within body_timeout_s) before the route runs;
    413 beyond the size, 408 (and the connection closed) past the time: a client that stalls
    mid-body holds nothing longer than that."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float = 60.0):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

    def _too_slow(self) -> ApiError:
        return ApiError(
            408,
            f"The request body did not arrive within {self.body_timeout_s:g} s.",
            code="request_timeout",
            headers={"Connection": "close"},
        )

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            f"The request body exceeds {self.max_body_bytes} bytes.",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_error(scope, receive, send, self._too_large())
            return
        chunks: list[bytes] = []
        num_bytes = 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                await _send_error(scope, receive, send, self._too_slow())
                return
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_body_bytes:
                await _send_error(scope, receive, send, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then wait for disconnect like a normal receive

        await self.app(scope, replay, send)


def _nest_form_fields(items: Any, list_fields: tuple[str, ...] = ()) -> dict[str, Any]:
    """`field[key]` values nested; a field of `list_fields` sent once or many times (as `field`
    or `field[]`, the openai client's name for a list) becomes a list."""
    fields: dict[str, Any] = {}
    for key, value in items:
        name = key.removesuffix("[]")
        if name in list_fields:
            fields.setdefault(name, []).append(value)
            continue
        match = NESTED_FORM_KEY.match(key)
        if match is None:
            fields[key] = value
            continue
        parent = fields.setdefault(match.group(1), {})
        if not isinstance(parent, dict):
            raise ApiError(
                400, f"{match.group(1)}: sent both as a value and as an object", param=match.group(1)
            )
        parent[match.group(2)] = value
    return fields


async def read_fields(
    request: Request, max_files: int = 1, list_fields: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The body as a dict of fields: JSON object, multipart or url-encoded form (uploads stay
    files; `list_fields` of a form are lists, see _nest_form_fields)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form(max_files=max_files, max_fields=MAX_FORM_FIELDS)
        return _nest_form_fields(form.multi_items(), list_fields)
    if content_type not in ("", "application/json"):
        raise ApiError(
            415,
            f"Unsupported content type '{content_type}'; send application/json or multipart/form-data.",
            code="unsupported_media_type",
        )
    return parse_json_object(await request.body())
