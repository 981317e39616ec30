"""POST /v1/images/generations (OpenAI shape) and GET /media/{id} for `response_format=url`."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from mstar.api.errors import ApiError
from mstar.api.media import IMAGE_MEDIA_TYPES, encode_image
from mstar.api.middleware import read_fields
from mstar.api.schemas import ImageGenerationRequest
from mstar.api.state import server_state

router = APIRouter()
DISCONNECT_POLL_S = 0.5


async def until_disconnected(request: Request, work: Coroutine[Any, Any, Any]) -> Any:
    """Await `work`, cancelling it (which aborts its runtime requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ApiError(499, "The client closed the request.", code="client_closed_request")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _encode_all(frames_list: list[Any], output_format: str, quality: int | None) -> list[bytes]:
    return [encode_image(frames[0], output_format, quality) for frames in frames_list]


def _encode_response(
    frames_list: list[Any], body: ImageGenerationRequest, output_format: str, size: str, created: int
) -> tuple[list[bytes], bytes | None]:
    """The images and, for b64_json, the response body: one trip to a thread for both."""
    images = _encode_all(frames_list, output_format, body.output_compression)
    if body.response_format == "url":
        return images, None
    return images, b64_json_body(images, output_format, size, created)


def b64_json_body(images: list[bytes], output_format: str, size: str, created: int) -> bytes:
    """The b64_json response as JSON bytes, assembled around the base64 text: base64 needs no JSON
    escaping, and json.dumps scans every character of a several-MB string (17 ms for a 1024x1024
    PNG on a 2-core host, on the event loop). Same document as the dict json.dumps would give."""
    parts = [b'{"created":%d,"data":[' % created]
    for index, image in enumerate(images):
        parts += [b"," if index else b"", b'{"b64_json":"', base64.b64encode(image), b'"}']
    tail = json.dumps({"output_format": output_format, "size": size}, separators=(",", ":"))
    parts += [b"],", tail[1:].encode("ascii")]
    return b"".join(parts)  # one copy of the base64 text


@router.post("/v1/images/generations")
async def create_images(request: Request) -> Response:
    arrived = time.perf_counter()
    state = server_state(request)
    body = ImageGenerationRequest.model_validate(await read_fields(request))
    generator = state.generator
    generator.check_model(body.model, "image")
    many_params = [
        generator.validate(body.generation_params(seed)) for seed in generator.seeds(body.seed, body.n)
    ]
    generator.check_ready()
    submitted = generator.submit_many(many_params)
    frames_list = await until_disconnected(request, generator.frames_of_all(submitted))
    output_format = body.output_format or "png"
    height, width = frames_list[0].shape[-3:-1]
    size, created = f"{width}x{height}", int(time.time())
    encode_started = time.perf_counter()
    images, content = await asyncio.to_thread(
        _encode_response, frames_list, body, output_format, size, created
    )
    ready = time.perf_counter()
    state.metrics.observe_media_encode(output_format, ready - encode_started)
    state.metrics.observe_media_ready(output_format, ready - arrived)
    if content is not None:
        return Response(content, media_type="application/json")
    media_type = IMAGE_MEDIA_TYPES[output_format]
    base_url = media_base_url(request, state.config)
    data = [{"url": f"{base_url}/media/{state.media.put(image, media_type)}"} for image in images]
    return JSONResponse({"created": created, "data": data, "output_format": output_format, "size": size})


def media_base_url(request: Request, config: Any) -> str:
    """config.public_url, else the address the request came in on (the server's socket): never the
    client's Host header, or a request could choose where the links it gets back point."""
    if config.public_url:
        return config.public_url
    scheme = request.scope.get("scheme", "http")
    host, port = request.scope.get("server") or (config.host, config.port)
    host = f"[{host}]" if ":" in host else host
    default_port = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" + (f":{port}" if port and port != default_port else "")


@router.get("/media/{media_id}")
async def get_media(media_id: str, request: Request) -> Response:
    item = server_state(request).media.get(media_id)
    return Response(item.data, media_type=item.media_type, headers={"Cache-Control": "private, max-age=3600"})
