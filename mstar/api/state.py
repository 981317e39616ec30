"""What every route reaches through `request.app.state.mstar`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from mstar.api.metrics import PrometheusMetrics
from mstar.api.service import Generator
from mstar.api.store import JobStore, MediaStore
from mstar.graph import ModelSpec


@dataclass
class ServerState:
    config: Any  # mstar.config.ServerConfig
    spec: ModelSpec
    runtime: Any  # mstar.runtime.runtime.Runtime (or a test double with the same surface)
    metrics: PrometheusMetrics
    generator: Generator
    jobs: JobStore
    media: MediaStore
    owns_runtime: bool = False
    text: Any = None  # mstar.api.text_service.TextService for text models, else None
    created_at: float = 0.0
    background: set = field(default_factory=set)


def server_state(request: Request) -> ServerState:
    return request.app.state.mstar
