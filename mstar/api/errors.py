"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} for every failure.

Client mistakes name the field; internal failures get a generic message and the details go to the log.
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mstar.errors import InvalidParam, Overloaded, UnknownModel

logger = logging.getLogger("mstar.api")

GENERIC_INTERNAL_MESSAGE = "The server had an error while processing your request."


class ApiError(Exception):
    """An error answered to the client as is."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(error: ApiError) -> JSONResponse:
    body = error_body(error.message, error.type, error.param, error.code)
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


def to_api_error(error: Exception) -> ApiError:
    """Map the project's error types (and pydantic's) to HTTP."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, InvalidParam):
        return ApiError(400, str(error), param=error.param, code="invalid_value")
    if isinstance(error, UnknownModel):
        return ApiError(404, str(error), param="model", code="model_not_found")
    if isinstance(error, Overloaded):
        retry_after_s = max(1, math.ceil(error.retry_after_s))
        return ApiError(
            429,
            "The server is at capacity; retry later.",
            type="rate_limit_error",
            code="overloaded",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(error, ValidationError | RequestValidationError):
        return validation_error(error.errors())
    logger.exception("internal error", exc_info=error)
    return ApiError(500, GENERIC_INTERNAL_MESSAGE, type="server_error", code="internal_error")


def validation_error(errors: list | tuple) -> ApiError:
    """The first pydantic error, naming its field (the `body` prefix dropped)."""
    first = errors[0] if errors else {}
    location = list(first.get("loc", ()))
    if location and location[0] in ("body", "query", "path"):  # FastAPI's source, not a field
        location = location[1:]
    param = _field_path(location)
    if first.get("type") == "json_invalid":
        return ApiError(400, "The request body is not valid JSON.", code="invalid_json")
    message = first.get("msg", "invalid request")
    if first.get("type") == "extra_forbidden":
        message = "unknown field"
    text = f"{param}: {message}" if param else message
    return ApiError(400, text, param=param, code=first.get("type", "invalid_value"))


def _field_path(location: list) -> str | None:
    """pydantic's location as a field path: ("lora", 1, "name") -> "lora[1].name"."""
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or None


def install_error_handlers(app: FastAPI) -> None:
    async def handle_any(request: Request, error: Exception) -> JSONResponse:
        return error_response(to_api_error(error))

    async def handle_http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return error_response(ApiError(error.status_code, str(error.detail), code=code))

    for error_type in (
        ApiError,
        InvalidParam,
        UnknownModel,
        Overloaded,
        ValidationError,
        RequestValidationError,
    ):
        app.add_exception_handler(error_type, handle_any)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(Exception, handle_any)
