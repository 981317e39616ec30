"""Wan2.2-TI2V-5B as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import): the API process validates requests with this spec.
Walks: `encode_text` (UMT5: prompt and, under guidance, negative prompt), then `t2v`
(Loop(dit) then vae_decoder) or, with an input image, `i2v` (vae_encoder, Loop(dit), vae_decoder).
The last walk leaves "frames" uint8 [F, H, W, 3]; params carry "fps".
"""

from __future__ import annotations

import math
from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.validation import (
    check_prompts,
    guidance_in,
    int_in,
    multiple_in,
    range_limit,
    sampling_limits,
    seed_or_random,
)
from mstar.models.wan22.config import Wan22Config
from mstar.models.wan22.geometry import WanGeometry
from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
from mstar.models.warmup import sized_warmup_requests
from mstar.params import VideoParams

MIN_FPS = 1
MAX_FPS = 60
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 8192


class WanParams(VideoParams, kw_only=True):
    """A Wan2.2 request; with an input image, image-to-video."""

    image_to_video: bool = False


class Wan22Spec(ModelSpec):
    name = "wan2.2-ti2v-5b"
    task = "text-to-video"  # and image-to-video with input_reference
    output_kind = "video"
    params_type = WanParams
    node_names = ("text_encoder", "vae_encoder", "dit", "vae_decoder")
    streams_text_encoder = True  # UMT5-XXL's ~10 GiB of weights can stay in host memory
    lora_keys = WAN22_LORA_KEYS
    walks = {
        "encode_text": Walk("encode_text", ("text_encoder",)),
        "t2v": Walk("t2v", (Loop("dit"), "vae_decoder"), outputs=("frames",)),
        "i2v": Walk("i2v", ("vae_encoder", Loop("dit"), "vae_decoder"), outputs=("frames",)),
    }

    def __init__(self, config: Wan22Config | None = None):
        self.config = config or Wan22Config()
        self.geometry = WanGeometry.of(self.config)

    def limits(self) -> dict[str, Any]:
        c = self.config
        return {
            "width": {**range_limit(c.default_width, c.size_multiple, c.max_width), "multiple_of": c.size_multiple},
            "height": {**range_limit(c.default_height, c.size_multiple, c.max_height), "multiple_of": c.size_multiple},
            "num_frames": {
                **range_limit(c.default_num_frames, 1, c.max_num_frames), "form": f"{c.vae_scale_temporal}k+1",
            },
            "fps": range_limit(c.default_fps, MIN_FPS, MAX_FPS),
            **sampling_limits(c.default_steps, c.max_steps, c.default_guidance, MAX_GUIDANCE, MAX_PROMPT_CHARS),
            "input_reference": {"optional": True, "kind": "image"},
        }  # fmt: skip

    def validate(self, params: GenerationParams) -> WanParams:
        c = self.config
        check_prompts(params, MAX_PROMPT_CHARS)
        fps = int_in("fps", params.fps, c.default_fps, MIN_FPS, MAX_FPS)
        return WanParams(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=self._side("width", params.width, c.default_width, c.max_width),
            height=self._side("height", params.height, c.default_height, c.max_height),
            num_frames=self._num_frames(params, fps),
            fps=fps,
            num_inference_steps=int_in("num_inference_steps", params.num_inference_steps, c.default_steps, 1, c.max_steps),
            guidance_scale=guidance_in(params.guidance_scale, c.default_guidance, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
            image_to_video=bool(params.has_input_reference),
        )  # fmt: skip

    def _side(self, field: str, value: int | None, default: int, maximum: int) -> int:
        multiple = self.config.size_multiple
        return multiple_in(field, value, default, multiple, maximum, multiple)

    def _num_frames(self, params: GenerationParams, fps: int) -> int:
        c = self.config
        step = c.vae_scale_temporal
        if params.seconds is not None and params.num_frames is not None:
            raise InvalidParam("seconds", "give either seconds or num_frames, not both")
        if params.seconds is not None:
            seconds = params.seconds
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not math.isfinite(seconds)
            ):
                raise InvalidParam("seconds", f"must be a number, got {seconds!r}")
            if seconds <= 0:
                raise InvalidParam("seconds", f"must be positive, got {seconds}")
            frames = step * max(0, round((seconds * fps - 1) / step)) + 1  # nearest 4k+1 to seconds*fps
            if frames > c.max_num_frames:
                raise InvalidParam(
                    "seconds", f"{seconds}s at {fps} fps is {frames} frames; at most {c.max_num_frames}"
                )
            return frames
        frames = int_in("num_frames", params.num_frames, c.default_num_frames, 1, c.max_num_frames)
        if (frames - 1) % step:
            raise InvalidParam(
                "num_frames",
                f"must be of the form {step}k+1 (e.g. {step * ((frames - 1) // step) + 1}), got {frames}",
            )
        return frames

    def step_tokens(self, params: WanParams) -> int:
        """DiT tokens of the request (latent frames x patches) times its guidance labels."""
        return self.geometry.step_tokens(
            params.width, params.height, params.num_frames, params.guidance_scale
        )

    def first_walk(self, params: WanParams) -> str:
        return "encode_text"

    def next_walk(self, params: WanParams, finished: str) -> str | None:
        if finished == "encode_text":
            return "i2v" if params.image_to_video else "t2v"
        return None

    def warmup_requests(self, config: Any) -> list[WanParams]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.wan22.nodes import build_nodes

        return build_nodes(self.config, ctx)
