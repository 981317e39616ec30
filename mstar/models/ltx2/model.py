"""LTX-2 as the runtime sees it: request params, limits, walks, node building.

Light on purpose (no torch at import): the API process validates requests with this spec.
Walks: `encode_text` (Gemma 3 + connectors: the prompt and, under guidance, the negative prompt),
then `t2v` (Loop(dit), audio_decoder, vae_decoder) or, with an input image, `i2v` (vae_encoder
first); with `"audio": false` the `_silent` twins skip the audio decode. The last walk leaves
"frames" uint8 [F, H, W, 3] and, with audio, "audio" float32 [channels, samples] at
`audio_sample_rate(params)`, muxed into the MP4 as its AAC track.
"""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.ltx2 import geometry
from mstar.models.ltx2.config import LTX2Config
from mstar.models.ltx2.presets import LTX2
from mstar.models.validation import (
    check_prompts,
    guidance_in,
    int_in,
    multiple_in,
    range_limit,
    sampling_limits,
    seed_or_random,
)
from mstar.models.warmup import sized_warmup_requests
from mstar.params import VideoParams

MIN_FPS = 1
MAX_FPS = 60
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 8192
MAX_SIDE = 2048  # pixels; the step-token cap bounds what a server takes below this
MAX_NUM_FRAMES = 257  # 8k + 1: about 10 s at 24 fps
MAX_STEPS = 200


class LTX2Params(VideoParams, kw_only=True):
    """An LTX-2 request. The scales past guidance_scale are LTX2Pipeline's defaults (the audio ones
    already resolved: a zero audio scale takes the video's, as the pipeline's `or` does)."""

    image_to_video: bool = False
    audio: bool = True  # decode the audio track (false: frames only)
    audio_guidance_scale: float = 7.0
    stg_scale: float = 1.0
    audio_stg_scale: float = 1.0
    modality_scale: float = 3.0
    audio_modality_scale: float = 3.0
    guidance_rescale: float = 0.7
    audio_guidance_rescale: float = 0.7


def _walks() -> dict[str, Walk]:
    decode = (Loop("dit"), "audio_decoder", "vae_decoder")  # video last: its frames can stream
    silent = (Loop("dit"), "vae_decoder")
    return {
        "encode_text": Walk("encode_text", ("text_encoder",)),
        "t2v": Walk("t2v", decode, outputs=("frames", "audio")),
        "i2v": Walk("i2v", ("vae_encoder", *decode), outputs=("frames", "audio")),
        "t2v_silent": Walk("t2v_silent", silent, outputs=("frames",)),
        "i2v_silent": Walk("i2v_silent", ("vae_encoder", *silent), outputs=("frames",)),
    }


class LTX2Spec(ModelSpec):
    name = "ltx-2"
    task = "text-to-video"  # and image-to-video with input_reference
    output_kind = "video+audio"
    params_type = LTX2Params
    node_names = ("text_encoder", "vae_encoder", "dit", "audio_decoder", "vae_decoder")
    streams_text_encoder = False
    walks = _walks()

    def __init__(self, config: LTX2Config | None = None):
        self.config = config or LTX2
        self.geometry = geometry.LTX2Geometry(self.config)

    @property
    def size_multiple(self) -> int:
        return self.config.defaults.size_multiple

    @property
    def min_steps(self) -> int:
        """Two with the terminal shift (one step would end on the shifted sigma), else one."""
        return geometry.MIN_STEPS if self.config.scheduler.shift_terminal else 1

    def limits(self) -> dict[str, Any]:
        d, m = self.config.defaults, self.size_multiple
        return {
            "width": {**range_limit(d.width, m, MAX_SIDE), "multiple_of": m},
            "height": {**range_limit(d.height, m, MAX_SIDE), "multiple_of": m},
            "num_frames": {
                **range_limit(d.num_frames, 1, MAX_NUM_FRAMES), "form": f"{self.config.vae.temporal_scale}k+1",
            },
            "fps": range_limit(round(d.frame_rate), MIN_FPS, MAX_FPS),
            **sampling_limits(d.num_inference_steps, MAX_STEPS, d.guidance_scale, MAX_GUIDANCE, MAX_PROMPT_CHARS),
            "input_reference": {"optional": True, "kind": "image"},
            "audio": {"default": True, "sample_rate": self.config.vocoder.output_sampling_rate},
            "num_inference_steps": range_limit(d.num_inference_steps, self.min_steps, MAX_STEPS),
        }  # fmt: skip

    def validate(self, params: GenerationParams) -> LTX2Params:
        d = self.config.defaults
        check_prompts(params, MAX_PROMPT_CHARS)
        fps = int_in("fps", params.fps, round(d.frame_rate), MIN_FPS, MAX_FPS)
        audio = True if params.audio is None else params.audio
        if not isinstance(audio, bool):
            raise InvalidParam("audio", f"must be true or false, got {audio!r}")
        return LTX2Params(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=self._side("width", params.width, d.width),
            height=self._side("height", params.height, d.height),
            num_frames=self._num_frames(params, fps),
            fps=fps,
            num_inference_steps=self._steps(params.num_inference_steps),
            guidance_scale=guidance_in(params.guidance_scale, d.guidance_scale, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
            image_to_video=bool(params.has_input_reference),
            audio=audio,
            audio_guidance_scale=d.audio_guidance_scale,
            stg_scale=d.stg_scale,
            audio_stg_scale=d.audio_stg_scale,
            modality_scale=d.modality_scale,
            audio_modality_scale=d.audio_modality_scale,
            guidance_rescale=d.guidance_rescale,
            audio_guidance_rescale=d.audio_guidance_rescale,
        )

    def _side(self, field: str, value: int | None, default: int) -> int:
        return multiple_in(field, value, default, self.size_multiple, MAX_SIDE, self.size_multiple)

    def _steps(self, value: Any) -> int:
        minimum = self.min_steps
        return int_in(
            "num_inference_steps", value, self.config.defaults.num_inference_steps, minimum, MAX_STEPS
        )

    def _num_frames(self, params: GenerationParams, fps: int) -> int:
        step = self.config.vae.temporal_scale
        if params.seconds is not None and params.num_frames is not None:
            raise InvalidParam("seconds", "give either seconds or num_frames, not both")
        if params.seconds is not None:
            seconds = params.seconds
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
                raise InvalidParam("seconds", f"must be a positive number, got {seconds!r}")
            frames = step * max(0, round((seconds * fps - 1) / step)) + 1  # nearest 8k+1 to seconds*fps
            if frames > MAX_NUM_FRAMES:
                raise InvalidParam(
                    "seconds", f"{seconds}s at {fps} fps is {frames} frames; at most {MAX_NUM_FRAMES}"
                )
            return frames
        frames = int_in("num_frames", params.num_frames, self.config.defaults.num_frames, 1, MAX_NUM_FRAMES)
        if not geometry.frames_are_valid(frames, self.config.vae):
            example = step * ((frames - 1) // step) + 1
            raise InvalidParam("num_frames", f"must be of the form {step}k+1 (e.g. {example}), got {frames}")
        return frames

    def labels(self, params: LTX2Params) -> tuple[str, ...]:
        """The DiT passes of one of the request's steps (LTX2Pipeline's guidance rule)."""
        return self.geometry.labels(
            params.guidance_scale, params.audio_guidance_scale, params.stg_scale, params.audio_stg_scale,
            params.modality_scale, params.audio_modality_scale,
        )  # fmt: skip

    def num_tokens(self, params: LTX2Params) -> tuple[int, int]:
        """(video tokens, audio tokens) of one of the request's passes."""
        video = geometry.video_geometry(
            params.num_frames, params.height, params.width, params.fps, self.config
        )
        audio = geometry.audio_geometry(params.num_frames, params.fps, self.config)
        return geometry.num_video_tokens(video, self.config.dit), geometry.num_audio_tokens(audio)

    def step_tokens(self, params: LTX2Params) -> int:
        """Video and audio tokens of the request times its guidance passes."""
        return geometry.step_tokens(*self.num_tokens(params), len(self.labels(params)))

    def audio_sample_rate(self, params: LTX2Params) -> int | None:
        return self.config.vocoder.output_sampling_rate if params.audio else None

    def first_walk(self, params: LTX2Params) -> str:
        return "encode_text"

    def next_walk(self, params: LTX2Params, finished: str) -> str | None:
        if finished != "encode_text":
            return None
        walk = "i2v" if params.image_to_video else "t2v"
        return walk if params.audio else f"{walk}_silent"

    def warmup_requests(self, config: Any) -> list[LTX2Params]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.ltx2.nodes import build_nodes

        return build_nodes(self.config, ctx)
