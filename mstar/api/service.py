"""The API's one path into the runtime: check the model and mode, validate, submit, collect events.

Runtime events: Progress(step, total) from Loop nodes, Piece(key, index, value) for outputs the
caller asked to stream, then exactly one Done(outputs) or Failed(message, kind)
(mstar.runtime.events).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from mstar.adapters import LoraCatalog, check_lora_choices
from mstar.api.errors import GENERIC_INTERNAL_MESSAGE, ApiError
from mstar.api.metrics import PrometheusMetrics
from mstar.errors import FailureKind, InvalidParam, Overloaded, UnknownModel
from mstar.graph import GenerationParams, ModelSpec
from mstar.params import LoraChoice, RequestParams
from mstar.runtime.events import Done, Failed, Piece, Progress

logger = logging.getLogger("mstar.api")

ProgressCallback = Callable[[int, int], None]
PieceCallback = Callable[[Any], Awaitable[None]]  # awaited per piece, in order


@dataclass
class Submitted:
    handle: Any
    params: RequestParams


def failure_error(kind: FailureKind, message: str) -> ApiError:
    """A runtime failure as the client sees it: no internal details (they are logged)."""
    logger.error("request failed (%s): %s", kind, message)
    if kind == "timeout":
        return ApiError(504, "The request timed out.", type="server_error", code="timeout")
    if kind == "worker_died":
        return ApiError(
            503,
            "A worker stopped; retry the request.",
            type="server_error",
            code="worker_unavailable",
            headers={"Retry-After": "5"},
        )
    if kind == "out_of_memory":
        return ApiError(
            503,
            "The device ran out of memory in this request's step; retry, or use a smaller size.",
            type="server_error",
            code="out_of_memory",
            headers={"Retry-After": "5"},
        )
    if kind == "shutdown":
        return ApiError(
            503,
            "The server is shutting down; retry the request.",
            type="server_error",
            code="shutting_down",
            headers={"Retry-After": "1"},
        )
    if kind == "aborted":
        return ApiError(503, "The request was aborted.", type="server_error", code="aborted")
    return ApiError(500, GENERIC_INTERNAL_MESSAGE, type="server_error", code="internal_error")


def check_step_tokens(spec: ModelSpec, params: RequestParams, max_tokens_per_step: int) -> None:
    """A request larger than one whole step could never be scheduled: refuse it now (400), naming
    num_frames when the same size at one frame fits, else size."""
    num_tokens = spec.step_tokens(params)
    if num_tokens is None or num_tokens <= max_tokens_per_step:
        return
    param = "size"
    num_frames = params.num_frames  # a token-costed request is an image or a video (ImageParams)
    one_frame = msgspec.structs.replace(params, num_frames=1)
    if num_frames > 1 and (spec.step_tokens(one_frame) or 0) <= max_tokens_per_step:
        param = "num_frames"
    shape = f"{params.width}x{params.height}" + (f"x{num_frames}" if num_frames > 1 else "")
    raise InvalidParam(
        param,
        f"{shape} needs {num_tokens} tokens per denoise step (both guidance passes), above this "
        f"server's max_tokens_per_step of {max_tokens_per_step}; use a smaller size or fewer frames",
    )


def _lora_catalog(lora_dir: str | None) -> LoraCatalog | None:
    if not lora_dir:
        return None
    from mstar.models.lora_families import LORA_KEY_RULES

    return LoraCatalog(lora_dir, LORA_KEY_RULES)


def route_kind(output_kind: str) -> str:
    """The media a model's route makes: a video with a soundtrack is still a video."""
    return "video" if output_kind == "video+audio" else output_kind


def served_kinds(spec: ModelSpec) -> tuple[str, ...]:
    """The media kinds whose routes reach the model: its own, then any extra it names."""
    return (route_kind(spec.output_kind), *spec.extra_media_kinds)


def for_route(spec: ModelSpec, params: GenerationParams, kind: str) -> GenerationParams:
    """A route's raw params for the model: an image asked of a video model is its one-frame video."""
    if kind == "image" and route_kind(spec.output_kind) == "video":
        return dataclasses.replace(params, num_frames=1)
    return params


def random_seed() -> int:
    return secrets.randbelow(2**31)


class Generator:
    def __init__(self, config: Any, spec: ModelSpec, runtime: Any, metrics: PrometheusMetrics):
        self.config = config
        self.spec = spec
        self.runtime = runtime
        self.metrics = metrics
        self.lora_catalog = _lora_catalog(getattr(config, "lora_dir", None))

    def check_model(self, model: str | None, output_kind: str) -> None:
        """404 for a model not served here; 400 when the route's media kind is not the model's."""
        if model is not None and model != self.spec.name:
            raise UnknownModel(model, [self.spec.name])
        if output_kind not in served_kinds(self.spec):
            raise ApiError(
                400,
                f"model '{self.spec.name}' is {self.spec.task}; this route makes {output_kind}s",
                param="model",
                code="unsupported_mode",
            )

    def check_ready(self) -> None:
        if not self.runtime.ready:
            raise ApiError(
                503,
                "The server is starting, or a worker is restarting or not responding; retry shortly.",
                type="server_error",
                code="not_ready",
                headers={"Retry-After": "5"},
            )

    def validate(self, params: GenerationParams) -> RequestParams:
        validated = self.spec.validate(params)
        check_step_tokens(self.spec, validated, self.config.max_tokens_per_step)
        if params.lora:
            validated = msgspec.structs.replace(validated, lora=self._check_lora(params))
        return validated

    def _check_lora(self, params: GenerationParams) -> tuple[LoraChoice, ...]:
        rules = self.spec.lora_keys
        return check_lora_choices(
            params.lora,
            self.lora_catalog,
            max_per_request=self.config.max_loras_per_request,
            max_rank=self.config.max_lora_rank,
            family=None if rules is None else rules.family,
            model_name=self.spec.name,
        )

    def submit(
        self, params: RequestParams, inputs: dict[str, Any] | None = None, stream_frames: bool = False
    ) -> Submitted:
        """`stream_frames`: the media tensor comes as pieces where the model sends it so (see
        `outputs`' on_piece)."""
        stream_outputs = (self.spec.output_tensor,) if stream_frames else ()
        try:
            handle = self.runtime.submit(
                params, inputs, timeout_s=self.config.request_timeout_s, stream_outputs=stream_outputs
            )
        except Overloaded:
            self.metrics.count_rejected()
            raise
        return Submitted(handle, params)

    def submit_many(
        self,
        many_params: list[RequestParams],
        inputs: dict[str, Any] | None = None,
        stream_frames: bool = False,
    ) -> list[Submitted]:
        """All or nothing: if the queue fills part way, the ones already admitted are aborted."""
        submitted: list[Submitted] = []
        try:
            for params in many_params:
                submitted.append(self.submit(params, inputs, stream_frames))
        except BaseException:
            self.abort_all(submitted)
            raise
        return submitted

    def abort_all(self, submitted: list[Submitted]) -> None:
        for item in submitted:
            self.runtime.abort(item.handle.request_id)

    async def outputs(
        self,
        submitted: Submitted,
        on_progress: ProgressCallback | None = None,
        on_piece: PieceCallback | None = None,
    ) -> dict[str, Any]:
        """Follow a request's events to its outputs; Failed becomes an ApiError. Pieces of a
        streamed output go to `on_piece` (required when the request was submitted streaming)."""
        async for event in submitted.handle.events():
            if isinstance(event, Done):
                return event.outputs
            if isinstance(event, Failed):
                raise failure_error(event.kind, event.message)
            if isinstance(event, Piece):
                if on_piece is None:
                    raise failure_error("error", f"a piece of '{event.key}' came with no one to take it")
                await on_piece(event.value)
            elif on_progress is not None and isinstance(event, Progress):
                on_progress(event.step, event.total)
        raise failure_error("error", "the event stream ended without a result")

    async def frames(self, submitted: Submitted, on_progress: ProgressCallback | None = None) -> Any:
        """The model's media tensor, uint8 [F, H, W, 3]."""
        return self.media_tensor(await self.outputs(submitted, on_progress))

    def media_tensor(self, outputs: dict[str, Any]) -> Any:
        frames = outputs.get(self.spec.output_tensor)
        if frames is None:
            raise failure_error("error", f"outputs lack '{self.spec.output_tensor}': {sorted(outputs)}")
        return frames

    def audio_tensor(self, outputs: dict[str, Any]) -> Any:
        """The model's soundtrack, float [channels, samples] (models with audio only)."""
        audio = outputs.get(self.spec.audio_tensor)
        if audio is None:
            raise failure_error("error", f"outputs lack '{self.spec.audio_tensor}': {sorted(outputs)}")
        return audio

    async def frames_of_all(self, submitted: list[Submitted]) -> list[Any]:
        """Every request's frames; a client that goes away aborts them all."""
        try:
            return await asyncio.gather(*(self.frames(item) for item in submitted))
        except BaseException:
            self.abort_all(submitted)
            raise

    def seeds(self, seed: int | None, n: int) -> list[int | None]:
        """n > 1: seeds seed, seed+1, ... (a random base when none is given so the n differ)."""
        if n == 1:
            return [seed]
        base = random_seed() if seed is None else seed
        return [base + index for index in range(n)]
