"""Test doubles: a small image and video ModelSpec and a Runtime with the documented surface
(INTERFACES.md section 1) that "denoises" by sleeping and returns seeded frames."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mstar.errors import InvalidParam, Overloaded
from mstar.graph import GenerationParams, ModelSpec, Walk
from mstar.params import ImageParams, VideoParams
from mstar.runtime.events import Done, Failed, Piece, Progress


@dataclass
class Stats:
    num_running: int
    num_waiting: int


class FakeImageParams(ImageParams, kw_only=True):
    step_sleep_s: float = 0.01  # the live nodes' step time


class FakeVideoParams(VideoParams, kw_only=True):
    step_sleep_s: float = 0.01
    has_input_reference: bool = False


class FakeImageSpec(ModelSpec):
    name = "fake-image"
    task = "text-to-image"
    output_kind = "image"
    params_type = FakeImageParams
    walks = {"generate": Walk("generate", ("dit",))}
    node_names = ("dit",)
    max_prompt_chars = 200
    max_side = 256
    max_steps = 50

    def limits(self) -> dict[str, Any]:
        return {
            "max_width": self.max_side,
            "max_height": self.max_side,
            "max_num_inference_steps": self.max_steps,
        }

    def _check_common(self, params: GenerationParams) -> None:
        if len(params.prompt) > self.max_prompt_chars:
            raise InvalidParam("prompt", f"at most {self.max_prompt_chars} characters")
        for name in ("width", "height"):
            value = getattr(params, name)
            if value is not None and (value % 16 or not 16 <= value <= self.max_side):
                raise InvalidParam(name, f"must be a multiple of 16 in [16, {self.max_side}]")
        steps = params.num_inference_steps
        if steps is not None and steps > self.max_steps:
            raise InvalidParam("num_inference_steps", f"at most {self.max_steps}")
        if params.seed is not None and params.seed >= 2**32:
            raise InvalidParam("seed", "must be below 2**32")

    def validate(self, params: GenerationParams) -> FakeImageParams:
        self._check_common(params)
        if params.has_input_reference:
            raise InvalidParam("input_reference", "this model is text-to-image")
        if params.num_frames is not None or params.seconds is not None:
            raise InvalidParam("num_frames", "this model makes images")
        return self.params_type(**self._resolved(params))

    def _resolved(self, params: GenerationParams) -> dict[str, Any]:
        return {
            "prompt": params.prompt,
            "width": params.width or 32,
            "height": params.height or 32,
            "num_inference_steps": params.num_inference_steps or 4,
            "guidance_scale": params.guidance_scale if params.guidance_scale is not None else 1.0,
            "seed": params.seed if params.seed is not None else 0,
        }

    def first_walk(self, params: Any) -> str:
        return "generate"

    def next_walk(self, params: Any, finished: str) -> str | None:
        return None

    def build_nodes(self, ctx: Any) -> dict:
        raise NotImplementedError("the fake runtime builds nothing")


class FakeVideoSpec(FakeImageSpec):
    name = "fake-video"
    task = "text-to-video"
    output_kind = "video"
    params_type = FakeVideoParams
    max_frames = 33

    def validate(self, params: GenerationParams) -> FakeVideoParams:
        self._check_common(params)
        fps = params.fps or 8
        num_frames = params.num_frames
        if num_frames is None and params.seconds is not None:
            num_frames = int(params.seconds * fps) // 4 * 4 + 1
        num_frames = num_frames or 9
        if num_frames % 4 != 1 or num_frames > self.max_frames:
            raise InvalidParam("num_frames", f"must be 4k+1 and at most {self.max_frames}")
        resolved = self._resolved(params)
        return FakeVideoParams(
            **resolved, num_frames=num_frames, fps=fps, has_input_reference=params.has_input_reference
        )


def seeded_frames(params: ImageParams) -> np.ndarray:
    """uint8 [F, H, W, 3]: a smooth per-frame colour ramp that depends on the seed, so tests can tell
    requests apart and lossy codecs (H.264 with 4:2:0 chroma) still round-trip closely."""
    rng = np.random.default_rng(params.seed)
    num_frames, height, width = params.num_frames, params.height, params.width
    colours = rng.integers(40, 200, size=(num_frames, 1, 1, 3))
    ramp = np.linspace(0, 50, width)[None, None, :, None]
    frames = np.broadcast_to(colours + ramp, (num_frames, height, width, 3))
    return np.ascontiguousarray(frames.clip(0, 255).astype(np.uint8))


class FakeHandle:
    def __init__(self, runtime: FakeRuntime, request_id: str, params: ImageParams, in_pieces: int = 0):
        self.runtime = runtime
        self.request_id = request_id
        self.params = params
        self.in_pieces = in_pieces  # > 0: streamed frames come as Piece events of this many frames
        self.aborted = False
        self.started = False

    async def events(self):
        self.started = True
        runtime = self.runtime
        start_s = time.perf_counter()
        total = self.params.num_inference_steps
        outcome = "completed"
        try:
            if runtime.metrics is not None:
                runtime.metrics.observe_queue_time(0.001)
            for step in range(1, total + 1):
                await asyncio.sleep(runtime.step_delay_s)
                if self.aborted:
                    outcome = "aborted"
                    yield Failed("aborted by the client", "aborted")
                    return
                if runtime.metrics is not None:
                    runtime.metrics.observe_step("dit", 1, 64, runtime.step_delay_s)
                yield Progress(step, total)
            await asyncio.sleep(runtime.decode_delay_s)
            if runtime.fail_kind is not None:
                outcome = "failed"
                yield Failed("secret internal detail: CUDA exploded at 0xdeadbeef", runtime.fail_kind)
                return
            frames = seeded_frames(self.params)
            if not self.in_pieces:
                yield Done({"frames": frames})
                return
            for index, start in enumerate(range(0, len(frames), self.in_pieces)):
                yield Piece("frames", index, frames[start : start + self.in_pieces])
            yield Done({})
        finally:
            runtime.active.pop(self.request_id, None)
            if runtime.metrics is not None:
                runtime.metrics.observe_request_end(outcome, time.perf_counter() - start_s)


class FakeRuntime:
    def __init__(self, metrics: Any = None, step_delay_s: float = 0.0, max_active: int = 64):
        self.metrics = metrics
        self.step_delay_s = step_delay_s
        self.max_active = max_active
        self.fail_kind: str | None = None
        self.piece_frames = 0  # > 0: send streamed frames in pieces of this many
        self.decode_delay_s = 0.0  # from the last step's progress to the frames (a VAE decode)
        self.ready_flag = True
        self.active: dict[str, FakeHandle] = {}
        self.submitted: list[tuple[ImageParams, dict[str, Any] | None]] = []
        self.aborted: list[str] = []
        self.started = False
        self._ids = itertools.count()

    @property
    def ready(self) -> bool:
        return self.ready_flag

    async def start(self, on_progress: Any = None) -> None:
        self.started = True

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        self.started = False

    def submit(self, params, inputs=None, timeout_s=None, request_id=None, stream_outputs=()) -> FakeHandle:
        if len(self.active) >= self.max_active:
            raise Overloaded(retry_after_s=2.5)
        request_id = request_id or f"req-{next(self._ids)}"
        handle = FakeHandle(self, request_id, params, self.piece_frames if "frames" in stream_outputs else 0)
        self.active[request_id] = handle
        self.submitted.append((params, inputs))
        return handle

    def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        handle = self.active.get(request_id)
        if handle is None:
            return False
        handle.aborted = True
        if not handle.started:  # nobody will follow its events: it ends here
            del self.active[request_id]
        return True

    def stats(self) -> Stats:
        return Stats(num_running=len(self.active), num_waiting=0)
