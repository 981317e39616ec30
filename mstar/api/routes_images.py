"""POST /v1/images/generations and /v1/images/edits (OpenAI shapes) and GET /media/{id} for
`response_format=url`.

An edit's images come as multipart files (`image`, or `image[]` for several, as the openai client
sends them) or, in a JSON body, as base64 data URLs (`image`, or `images: [{"image_url": ...}]`);
the server never fetches a remote URL. Each is decoded (PNG, JPEG or WebP, the upload pixel cap)
with a 400 naming it (`image[1]`), counted against the model's reference limit, and handed to the
runtime as the inputs reference_0, reference_1, ...; their sizes go to the spec's validation."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from mstar.api.errors import ApiError
from mstar.api.media import IMAGE_MEDIA_TYPES, decode_base64, decode_data_url, decode_image, encode_image
from mstar.api.middleware import read_fields
from mstar.api.schemas import ImageEditRequest, ImageGenerationRequest
from mstar.api.service import for_route
from mstar.api.state import server_state
from mstar.errors import InvalidParam
from mstar.graph import reference_image_input

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
        generator.validate(for_route(state.spec, body.generation_params(seed), "image"))
        for seed in generator.seeds(body.seed, body.n)
    ]
    generator.check_ready()
    submitted = generator.submit_many(many_params)
    frames_list = await until_disconnected(request, generator.frames_of_all(submitted))
    return await _images_response(request, body, frames_list, arrived)


async def _images_response(
    request: Request, body: ImageGenerationRequest | ImageEditRequest, frames_list: list[Any], arrived: float
) -> Response:
    """The OpenAI images response (b64_json, or url links to /media) of the requests' frames."""
    state = server_state(request)
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


MAX_EDIT_FILES = 16  # read this many uploads at most; the model's own limit is checked after


def _image_bytes(value: Any, param: str) -> Any:
    """An upload's bytes (awaitable), or a data URL's / base64 string's; remote URLs are refused."""
    if isinstance(value, UploadFile):
        return value.read()
    if isinstance(value, dict) and "image_url" in value:
        return _image_bytes(value["image_url"], f"{param}.image_url")
    if isinstance(value, dict) and "file_id" in value:
        raise InvalidParam(f"{param}.file_id", "file ids are not supported; upload the image instead")
    if isinstance(value, str) and value.startswith(("http://", "https://")):
        raise InvalidParam(param, "remote image URLs are not fetched; upload the file or send a data URL")
    if isinstance(value, str):
        return decode_data_url(value, param) if value.startswith("data:") else decode_base64(value, param)
    raise InvalidParam(param, "send an image file (PNG, JPEG or WebP) or a base64 data URL")


def pop_edit_images(fields: dict[str, Any], max_images: int) -> tuple[str, list[Any]]:
    """(the field's name, its values) of the edit's images, taken out of `fields`; counted here."""
    images, json_images = fields.pop("image", None), fields.pop("images", None)
    if images is not None and json_images is not None:
        raise InvalidParam("images", "send either image or images, not both")
    field, values = ("image", images) if json_images is None else ("images", json_images)
    values = [] if values in (None, "") else values if isinstance(values, list) else [values]
    if not values:
        raise InvalidParam(field, "an edit needs at least one image")
    if len(values) > max_images:
        raise InvalidParam(field, f"at most {max_images} images, got {len(values)}")
    return field, values


async def decode_edit_images(field: str, values: list[Any]) -> list[Any]:
    """The edit's images as uint8 [H, W, 3] arrays, in order, each checked (a 400 naming it)."""
    decoded = []
    for index, value in enumerate(values):
        param = field if len(values) == 1 else f"{field}[{index}]"
        data = _image_bytes(value, param)
        data = data if isinstance(data, bytes) else await data
        decoded.append(await asyncio.to_thread(decode_image, data, param))
    return decoded


@router.post("/v1/images/edits")
async def edit_images(request: Request) -> Response:
    arrived = time.perf_counter()
    state = server_state(request)
    generator = state.generator
    max_images = state.spec.max_reference_images
    if max_images == 0:
        raise ApiError(
            400, f"model '{state.spec.name}' does not edit images (it takes no reference images)",
            param="model", code="unsupported_mode",
        )  # fmt: skip
    fields = await read_fields(request, max_files=MAX_EDIT_FILES, list_fields=("image",))
    if fields.pop("mask", None) is not None:
        raise InvalidParam("mask", "masks are not supported; the edit follows the prompt and the images")
    field, values = pop_edit_images(fields, max_images)
    body = ImageEditRequest.model_validate(fields)
    generator.check_model(body.model, "image")
    images = await decode_edit_images(field, values)
    sizes = tuple((int(image.shape[1]), int(image.shape[0])) for image in images)  # (width, height)
    many_params = [
        generator.validate(body.generation_params(seed, sizes)) for seed in generator.seeds(body.seed, body.n)
    ]
    generator.check_ready()
    inputs = {reference_image_input(index): image for index, image in enumerate(images)}
    submitted = generator.submit_many(many_params, inputs)
    frames_list = await until_disconnected(request, generator.frames_of_all(submitted))
    return await _images_response(request, body, frames_list, arrived)


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
