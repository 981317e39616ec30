"""Errors every layer may raise; the API maps them to HTTP statuses."""

from collections.abc import Sequence
from typing import Literal, get_args

# How a request can fail inside the runtime; the API maps each to its status.
FailureKind = Literal["error", "aborted", "shutdown", "timeout", "worker_died", "out_of_memory"]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


class InvalidParam(ValueError):
    """A user-supplied field is wrong. Becomes HTTP 400 with `param` naming the field."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class UnknownModel(LookupError):
    """The requested model is not served here. Becomes HTTP 404."""

    def __init__(self, name: str, served: Sequence[str] = ()):
        listed = f"; served: {', '.join(served)}" if served else ""
        super().__init__(f"model '{name}' is not served here{listed}")
        self.name = name


class Overloaded(RuntimeError):
    """The waiting queue is full. Becomes HTTP 429 with Retry-After."""

    def __init__(self, retry_after_s: float = 1.0):
        super().__init__("server is at capacity, retry later")
        self.retry_after_s = retry_after_s


class RequestFailed(RuntimeError):
    """A request failed inside the runtime. The client sees a generic message; the log has details.
    `kind` says how (FailureKind)."""

    def __init__(self, message: str = "request failed", kind: FailureKind = "error"):
        super().__init__(message)
        self.message = message
        self.kind = kind
