"""Operations routes: /health (process alive), /ready (503 until the runtime is), /metrics, /v1/models."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mstar.api.metrics import CONTENT_TYPE
from mstar.api.service import served_kinds
from mstar.api.state import ServerState, server_state
from mstar.errors import UnknownModel

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    if server_state(request).runtime.ready:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not_ready"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.render(), media_type=CONTENT_TYPE)


def _model_card(state: ServerState) -> dict[str, Any]:
    spec = state.spec
    card = {
        "id": spec.name,
        "object": "model",
        "created": int(state.created_at),
        "owned_by": "mstar",
        "task": spec.task,
        "output_kind": spec.output_kind,
        "media_kinds": list(served_kinds(spec)),  # the routes' kinds that reach it
        "limits": spec.limits(),
        # Size limits combine: tokens (x guidance labels) of one request per denoise step, at most this.
        "max_tokens_per_step": state.config.max_tokens_per_step,
    }
    if state.text is not None:  # a text model: prompt and output tokens of one request, at most
        card["max_model_len"] = card["context_length"] = state.text.frontend.context_length
    return card


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(server_state(request))]}


@router.get("/v1/models/{model_id}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    state = server_state(request)
    if model_id != state.spec.name:
        raise UnknownModel(model_id, [state.spec.name])
    return _model_card(state)


@router.get("/v1/loras")
async def list_loras(request: Request) -> dict[str, Any]:
    """The adapters of lora_dir: name (`id`), rank, family when its keys tell, resident or not."""
    state = server_state(request)
    catalog = state.generator.lora_catalog
    infos = await asyncio.to_thread(catalog.scan) if catalog is not None else []
    loaded_adapters = getattr(state.runtime, "loaded_adapters", None)
    loaded = set(loaded_adapters()) if loaded_adapters is not None else set()
    return {"object": "list", "data": [info.card(info.name in loaded) for info in infos]}
