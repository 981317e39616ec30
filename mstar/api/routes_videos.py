"""Video jobs in the OpenAI Videos shape: create (queued at once), retrieve, list, download, delete.

The job runs as an asyncio task that follows the runtime's events; the MP4 is muxed in a thread so
the event loop keeps serving while it encodes. Frames are muxed as they come: a model that sends a
clip's frames in pieces (Wan's VAE, chunk by chunk) has most of the clip encoded when it ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import UploadFile

from mstar.api.errors import GENERIC_INTERNAL_MESSAGE, ApiError
from mstar.api.media import VIDEO_MEDIA_TYPE, Mp4Writer, decode_base64, decode_data_url, decode_image
from mstar.api.middleware import read_fields
from mstar.api.schemas import VideoCreateRequest
from mstar.api.service import Generator, ProgressCallback, Submitted
from mstar.api.state import ServerState, server_state
from mstar.api.store import FINISHED, VideoJob
from mstar.errors import InvalidParam
from mstar.params import VideoParams

logger = logging.getLogger("mstar.api")
router = APIRouter()

# The `openai-poll-after-ms` hint, one rule for every client, from the job's own progress: while it
# denoises at a known pace, half its estimated time to the last step (so a poll lands near the end
# without many polls before it); the floor while no pace is known yet (fewer than two steps seen:
# a client that keeps its first hint, as the OpenAI SDK's poll helper does, then polls often rather
# than every 500 ms) and once the steps are done (decode and mux report no progress of their own).
MAX_POLL_AFTER_MS = 500
MIN_POLL_AFTER_MS = 100
DEFAULT_FPS = 16


async def _reference_bytes(reference: Any) -> bytes:
    """input_reference as a multipart file, a data URL / base64 string, or {"image_url": data URL}."""
    if isinstance(reference, UploadFile):
        return await reference.read()
    if isinstance(reference, str):
        if reference.startswith("data:"):
            return decode_data_url(reference)
        return decode_base64(reference, "input_reference")
    if isinstance(reference, dict) and isinstance(reference.get("image_url"), str):
        return decode_data_url(reference["image_url"], "input_reference.image_url")
    if isinstance(reference, dict) and "file_id" in reference:
        raise InvalidParam("input_reference.file_id", "file ids are not supported; upload the image instead")
    raise InvalidParam("input_reference", "send an image file, a base64 data URL or {'image_url': data URL}")


async def read_reference(reference: Any) -> Any:
    """The reference image as uint8 [H, W, 3], or None when absent."""
    if reference is None or reference == "":
        return None
    data = await _reference_bytes(reference)
    return await asyncio.to_thread(decode_image, data)


def _describe(body: VideoCreateRequest, params: VideoParams) -> tuple[str, str]:
    """The job's `size` and `seconds` strings from the resolved params (the model's defaults filled in)."""
    width, height = params.width, params.height
    size = f"{width}x{height}" if width and height else (body.size or "")
    if body.seconds is not None:
        return size, body.seconds
    num_frames, fps = params.num_frames, params.fps
    seconds = f"{num_frames / fps:g}" if num_frames and fps else ""
    return size, seconds


def audio_track(spec: Any, params: VideoParams) -> dict[str, Any] | None:
    """The job's soundtrack as the job object shows it: sample rate and duration (the muxed track
    is cut or padded to the video's), None for a silent video."""
    sample_rate = spec.audio_sample_rate(params)
    if sample_rate is None:
        return None
    num_samples = round(params.num_frames * sample_rate / params.fps)
    return {"sample_rate": sample_rate, "seconds": num_samples / sample_rate, "codec": "aac"}


def poll_after_ms(job: VideoJob) -> int:
    """The poll hint of a job that has not finished (the rule above MAX_POLL_AFTER_MS)."""
    if job.num_steps_done < 2 or job.num_steps_done >= job.num_steps:
        return MIN_POLL_AFTER_MS
    step_s = (job.last_step_at - job.first_step_at) / (job.num_steps_done - 1)
    left_ms = 1000 * step_s * (job.num_steps - job.num_steps_done)
    return round(min(MAX_POLL_AFTER_MS, max(MIN_POLL_AFTER_MS, left_ms / 2)))


@dataclass
class MuxTimeline:
    """perf_counter times of a video request's end, for the log line that says where it went."""

    arrived: float
    steps_done: float | None = None
    last_piece_in: float | None = None  # the last piece of frames taken from the runtime
    last_piece_written: float | None = None  # ... and handed to the encoder
    outputs: float | None = None  # the runtime's outputs (the request's end there)
    ready: float | None = None  # the MP4's bytes

    def describe(self) -> str:
        marks = {
            "steps done": self.steps_done,
            "last frames in": self.last_piece_in,
            "written": self.last_piece_written,
            "outputs": self.outputs,
            "mp4": self.ready,
        }
        return ", ".join(
            f"{name} {1000 * (at - self.arrived):.0f}" for name, at in marks.items() if at is not None
        )


async def mux_video(
    generator: Generator,
    submitted: Submitted,
    on_progress: ProgressCallback | None = None,
    timeline: MuxTimeline | None = None,
) -> tuple[bytes, Mp4Writer]:
    """Follow a video request to its MP4 (and the writer, which knows the frames' count and size).
    Frames the model sends in pieces are muxed as they come, in a thread; whole frames at the end;
    a soundtrack (the spec's audio_tensor) at the end, as its AAC track."""
    fps = int(getattr(submitted.params, "fps", 0) or DEFAULT_FPS)
    audio_sample_rate = generator.spec.audio_sample_rate(submitted.params)
    writer = Mp4Writer(fps, audio_sample_rate)
    timeline = timeline or MuxTimeline(time.perf_counter())

    async def on_piece(frames: Any) -> None:  # a clip's frames as its chunks decode: mux them now
        timeline.last_piece_in = time.perf_counter()
        await asyncio.to_thread(writer.write, frames)
        timeline.last_piece_written = time.perf_counter()

    try:
        outputs = await generator.outputs(submitted, on_progress, on_piece)
        encode_started = timeline.outputs = time.perf_counter()
        if writer.num_frames == 0:  # the model sent its frames whole
            await asyncio.to_thread(writer.write, generator.media_tensor(outputs))
        if audio_sample_rate is not None:
            await asyncio.to_thread(writer.write_audio, generator.audio_tensor(outputs))
        content = await asyncio.to_thread(writer.finish)
        timeline.ready = time.perf_counter()
        generator.metrics.observe_media_encode("mp4", timeline.ready - encode_started)
        return content, writer
    finally:
        # In a thread: a write of a cancelled request (deleted) may still run there; close waits for it.
        await asyncio.to_thread(writer.close)


async def run_job(state: ServerState, job: VideoJob, submitted: Submitted, arrived: float) -> None:
    """Follow the job's request to its MP4; `arrived`: the create request's perf_counter time."""
    timeline = MuxTimeline(arrived)

    def on_progress(step: int, total: int) -> None:
        now = time.monotonic()
        job.status = "in_progress"
        job.num_steps_done, job.num_steps = step, total
        job.first_step_at = job.first_step_at or now
        job.last_step_at = now
        if step >= total:
            timeline.steps_done = time.perf_counter()

    try:
        job.content, writer = await mux_video(state.generator, submitted, on_progress, timeline)
        state.metrics.observe_media_ready("mp4", time.perf_counter() - arrived)
        state.jobs.finish(job, "completed")
        logger.info(
            "video %s, %d frames: ms after arrival: %s", job.id, writer.num_frames, timeline.describe()
        )
    except ApiError as error:
        job.error = {"code": error.code or "failed", "message": error.message}
        state.jobs.finish(job, "failed")
    except Exception:
        logger.exception("video job %s failed", job.id)
        state.generator.abort_all([submitted])  # the muxer failed mid-clip: stop the request too
        job.error = {"code": "internal_error", "message": GENERIC_INTERNAL_MESSAGE}
        state.jobs.finish(job, "failed")


@router.post("/v1/videos")
async def create_video(request: Request) -> JSONResponse:
    arrived = time.perf_counter()
    state = server_state(request)
    fields = await read_fields(request)
    reference_field = fields.pop("input_reference", None)
    body = VideoCreateRequest.model_validate(fields)
    generator = state.generator
    generator.check_model(body.model, "video")
    reference = await read_reference(reference_field)
    params = generator.validate(body.generation_params(has_input_reference=reference is not None))
    generator.check_ready()
    inputs = {"input_reference": reference} if reference is not None else None
    submitted = generator.submit(params, inputs, stream_frames=state.config.stream_video_frames)
    size, seconds = _describe(body, params)
    job = state.jobs.new_job(
        model=state.spec.name,
        prompt=body.prompt,
        size=size,
        seconds=seconds,
        request_id=submitted.handle.request_id,
        audio=audio_track(state.spec, params),
    )
    job.task = asyncio.create_task(run_job(state, job, submitted, arrived))
    return JSONResponse(job.to_json(), headers={"openai-poll-after-ms": str(poll_after_ms(job))})


@router.get("/v1/videos/{video_id}")
async def retrieve_video(video_id: str, request: Request) -> JSONResponse:
    job = server_state(request).jobs.get(video_id)
    if job.status in FINISHED:
        return JSONResponse(job.to_json())
    return JSONResponse(job.to_json(), headers={"openai-poll-after-ms": str(poll_after_ms(job))})


@router.get("/v1/videos/{video_id}/content")
async def download_video(
    video_id: str, request: Request, variant: Literal["video"] = Query("video")
) -> Response:
    job = server_state(request).jobs.get(video_id)
    if job.status != "completed" or job.content is None:
        raise ApiError(
            400,
            f"video '{video_id}' is {job.status}; content exists once it is completed",
            code="video_not_ready",
        )
    return Response(job.content, media_type=VIDEO_MEDIA_TYPE)


@router.get("/v1/videos")
async def list_videos(
    request: Request,
    after: str | None = Query(None),
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = Query("desc"),
) -> dict[str, Any]:
    jobs, has_more = server_state(request).jobs.list(after, limit, order)
    return {
        "object": "list",
        "data": [job.to_json() for job in jobs],
        "first_id": jobs[0].id if jobs else None,
        "last_id": jobs[-1].id if jobs else None,
        "has_more": has_more,
    }


@router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, request: Request) -> dict[str, Any]:
    state = server_state(request)
    job = state.jobs.remove(video_id)
    if job.status not in FINISHED:
        state.runtime.abort(job.request_id)
    if job.task is not None and not job.task.done():
        job.task.cancel()
    return {"id": job.id, "object": "video.deleted", "deleted": True}
