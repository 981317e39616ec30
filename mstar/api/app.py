"""The FastAPI app factory. `create_app(config, spec, runtime)` lets tests inject a runtime; without
one the app builds the real Runtime and its lifespan starts and stops it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from mstar.api import routes_images, routes_native, routes_ops, routes_text, routes_videos
from mstar.api.errors import install_error_handlers
from mstar.api.hosts import HostOriginMiddleware, HostPolicy
from mstar.api.media import warm_up_encoders
from mstar.api.metrics import PrometheusMetrics
from mstar.api.middleware import ApiKeyMiddleware, BodyLimitMiddleware
from mstar.api.service import Generator
from mstar.api.state import ServerState
from mstar.api.store import JobStore, MediaStore
from mstar.graph import ModelSpec


def _build_runtime(config: Any, spec: ModelSpec, metrics: PrometheusMetrics) -> Any:
    from mstar.runtime.runtime import Runtime

    return Runtime(config, spec, metrics)


def _text_service(config: Any, spec: ModelSpec, runtime: Any, metrics: PrometheusMetrics) -> Any:
    """Text models get the chat and completions service (it loads the tokenizer), others None."""
    if spec.output_kind != "text":
        return None
    from mstar.api.text_service import TextService

    return TextService(config, spec, runtime, metrics)


async def _cancel_jobs(state: ServerState) -> None:
    tasks = [job.task for job in state.jobs.all() if job.task is not None and not job.task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def create_app(
    config: Any,
    spec: ModelSpec | None = None,
    runtime: Any = None,
    metrics: PrometheusMetrics | None = None,
) -> FastAPI:
    """An app serving `spec` (default: config.model) through `runtime`.

    Pass `metrics` when the runtime was built with it, so the runtime's observations reach /metrics.
    When `runtime` is None the app builds one and owns it: the lifespan starts and shuts it down.
    """
    if spec is None:
        from mstar.models.registry import get_model_spec

        spec = get_model_spec(config.model)
    metrics = metrics or PrometheusMetrics(spec.name)
    owns_runtime = runtime is None
    if owns_runtime:
        runtime = _build_runtime(config, spec, metrics)
    metrics.bind_runtime(runtime.stats)
    state = ServerState(
        config=config,
        spec=spec,
        runtime=runtime,
        metrics=metrics,
        generator=Generator(config, spec, runtime, metrics),
        jobs=JobStore(config.job_ttl_s),
        media=MediaStore(config.job_ttl_s),
        owns_runtime=owns_runtime,
        created_at=time.time(),
        text=_text_service(config, spec, runtime, metrics),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if state.owns_runtime:
            await runtime.start()
        await asyncio.to_thread(warm_up_encoders, spec.output_kind)
        try:
            yield
        finally:
            await _cancel_jobs(state)
            if state.owns_runtime:
                await runtime.shutdown()

    app = FastAPI(title="mstar", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.mstar = state
    install_error_handlers(app)
    for module in (routes_ops, routes_images, routes_videos, routes_native, routes_text):
        app.include_router(module.router)
    # Added last = outermost: Host and Origin first, then the key, both before any body is read.
    app.add_middleware(
        BodyLimitMiddleware, max_body_bytes=config.max_body_bytes, body_timeout_s=config.body_timeout_s
    )
    app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    policy = HostPolicy(config.host, config.allowed_hosts, config.public_url)
    app.add_middleware(HostOriginMiddleware, policy=policy)
    return app
