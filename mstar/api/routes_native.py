"""POST /generate: the native route. Newline-delimited JSON: progress events, then one output per request
(base64 media), then {"type": "done"}. Validation errors answer before the stream starts (400/404);
a failure after that is an {"type": "error"} line. A client that disconnects aborts its requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from mstar.api.errors import GENERIC_INTERNAL_MESSAGE, ApiError, error_body
from mstar.api.media import IMAGE_MEDIA_TYPES, VIDEO_MEDIA_TYPE, encode_image
from mstar.api.middleware import read_fields
from mstar.api.routes_videos import audio_track, mux_video, read_reference
from mstar.api.schemas import NativeGenerateRequest
from mstar.api.service import Generator, Submitted, route_kind
from mstar.api.state import server_state

logger = logging.getLogger("mstar.api")
router = APIRouter()
NDJSON = "application/x-ndjson"


def _line(event: dict[str, Any]) -> bytes:
    return (json.dumps(event) + "\n").encode()


def encode_image_media(frames: Any, output_format: str) -> tuple[bytes, str]:
    return encode_image(frames[0], output_format), IMAGE_MEDIA_TYPES[output_format]


async def _output(generator: Generator, item: Submitted, output_format: str, on_progress) -> dict[str, Any]:
    """One request's output line fields: the media encoded in a thread; a video's MP4
    muxed as its frames come (routes_videos.mux_video)."""
    extra: dict[str, Any] = {}
    if route_kind(generator.spec.output_kind) == "video":
        data, writer = await mux_video(generator, item, on_progress)
        media_type, num_frames, (height, width) = VIDEO_MEDIA_TYPE, writer.num_frames, writer.frame_size
        audio = audio_track(generator.spec, item.params)
        extra = {} if audio is None else {"audio": audio}
    else:
        frames = await generator.frames(item, on_progress)
        data, media_type = await asyncio.to_thread(encode_image_media, frames, output_format)
        num_frames, height, width = frames.shape[:3]
    return {
        "media_type": media_type,
        "width": int(width),
        "height": int(height),
        "num_frames": int(num_frames),
        "seed": item.params.seed,
        **extra,
        "data": base64.b64encode(data).decode("ascii"),
    }


async def _follow(
    generator: Generator, index: int, item: Submitted, output_format: str, queue: asyncio.Queue
) -> None:
    """Push this request's progress, then its output line or its error, onto the shared queue."""

    def on_progress(step: int, total: int) -> None:
        queue.put_nowait(("progress", index, {"step": step, "total": total}))

    try:
        queue.put_nowait(("output", index, await _output(generator, item, output_format, on_progress)))
    except ApiError as error:
        queue.put_nowait(("error", index, error))
    except Exception:
        logger.exception("native request %s failed", item.handle.request_id)
        generator.abort_all([item])  # an encode that failed mid-clip: stop the request too
        queue.put_nowait(("error", index, ApiError(500, GENERIC_INTERNAL_MESSAGE, type="server_error")))


async def _stream(
    generator: Generator, submitted: list[Submitted], output_format: str
) -> AsyncIterator[bytes]:
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [
        asyncio.create_task(_follow(generator, i, item, output_format, queue))
        for i, item in enumerate(submitted)
    ]
    unfinished = set(range(len(submitted)))
    try:
        while unfinished:
            kind, index, value = await queue.get()
            if kind == "progress":
                yield _line({"type": "progress", "index": index, **value})
            elif kind == "error":
                unfinished.discard(index)
                yield _line(
                    {
                        "type": "error",
                        "index": index,
                        **error_body(value.message, value.type, code=value.code),
                    }
                )
                return
            else:
                unfinished.discard(index)
                yield _line({"type": "output", "index": index, **value})
        yield _line({"type": "done"})
    finally:
        for task in tasks:
            task.cancel()
        generator.abort_all([submitted[index] for index in unfinished])


@router.post("/generate")
async def generate(request: Request) -> StreamingResponse:
    state = server_state(request)
    fields = await read_fields(request)
    reference_field = fields.pop("input_reference", None)
    body = NativeGenerateRequest.model_validate(fields)
    generator = state.generator
    kind = route_kind(state.spec.output_kind)
    generator.check_model(body.model, kind)
    if body.output_format is not None and kind == "video":
        raise ApiError(400, "output_format applies to image models (videos are MP4)", param="output_format")
    reference = await read_reference(reference_field)
    has_reference = reference is not None
    many_params = [
        generator.validate(body.native_params(seed, has_reference))
        for seed in generator.seeds(body.seed, body.n)
    ]
    generator.check_ready()
    inputs = {"input_reference": reference} if has_reference else None
    stream_frames = kind == "video" and state.config.stream_video_frames
    submitted = generator.submit_many(many_params, inputs, stream_frames=stream_frames)
    return StreamingResponse(_stream(generator, submitted, body.output_format or "png"), media_type=NDJSON)
