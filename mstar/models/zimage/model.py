"""Z-Image-Turbo as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import): the API process validates requests with this spec.
Walks: `encode_text` (Qwen3, prompt and, under guidance, negative prompt) then `t2i`
(Loop(dit) of flow-matching Euler steps, then vae_decoder -> "frames" uint8 [1, H, W, 3]).
"""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.validation import (
    check_prompts,
    check_single_image,
    guidance_in,
    multiple_in,
    range_limit,
    sampling_limits,
    seed_or_random,
    single_frame_limit,
    steps_in,
)
from mstar.models.warmup import sized_warmup_requests
from mstar.models.zimage.config import REAL, ZImageConfig
from mstar.models.zimage.geometry import ZImageGeometry
from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS
from mstar.params import ImageParams

SIZE_MULTIPLE = 16  # VAE 8x times patch 2
DEFAULT_SIZE = 1024
MIN_SIDE = 64
MAX_SIDE = 4096
MIN_PIXELS = 256 * 256
MAX_PIXELS = 2048 * 2048
DEFAULT_STEPS = 9
MAX_STEPS = 50
DEFAULT_GUIDANCE = 0.0  # Turbo is distilled: no classifier-free guidance by default
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 8192


class ZImageParams(ImageParams, kw_only=True):
    """A Z-Image-Turbo request."""


class ZImageSpec(ModelSpec):
    name = "z-image-turbo"
    task = "text-to-image"
    output_kind = "image"
    params_type = ZImageParams
    node_names = ("text_encoder", "dit", "vae_decoder")
    lora_keys = ZIMAGE_LORA_KEYS
    walks = {
        "encode_text": Walk("encode_text", ("text_encoder",)),
        "t2i": Walk("t2i", (Loop("dit"), "vae_decoder"), outputs=("frames",)),
    }

    # Class attributes so a spec for a smaller VAE (tests' tiny one) can lower them.
    min_side = MIN_SIDE
    min_pixels = MIN_PIXELS

    def __init__(self, config: ZImageConfig = REAL):
        self.config = config
        self.geometry = ZImageGeometry.of(config)

    def limits(self) -> dict[str, Any]:
        side = {**range_limit(DEFAULT_SIZE, self.min_side, MAX_SIDE), "multiple_of": SIZE_MULTIPLE}
        return {
            "width": side,
            "height": dict(side),
            "pixels": {"min": self.min_pixels, "max": MAX_PIXELS},
            **sampling_limits(DEFAULT_STEPS, MAX_STEPS, DEFAULT_GUIDANCE, MAX_GUIDANCE, MAX_PROMPT_CHARS),
            "num_frames": single_frame_limit(),
        }

    def validate(self, params: GenerationParams) -> ZImageParams:
        check_prompts(params, MAX_PROMPT_CHARS)
        check_single_image(params, self.name)
        width = self._side("width", params.width)
        height = self._side("height", params.height)
        if not self.min_pixels <= width * height <= MAX_PIXELS:
            raise InvalidParam(
                "width",
                f"width*height must be in [{self.min_pixels}, {MAX_PIXELS}] pixels, got {width}x{height}",
            )
        return ZImageParams(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=width,
            height=height,
            num_inference_steps=steps_in(params.num_inference_steps, DEFAULT_STEPS, MAX_STEPS),
            guidance_scale=guidance_in(params.guidance_scale, DEFAULT_GUIDANCE, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
        )

    def _side(self, field: str, value: int | None) -> int:
        return multiple_in(field, value, DEFAULT_SIZE, self.min_side, MAX_SIDE, SIZE_MULTIPLE)

    def step_tokens(self, params: ZImageParams) -> int:
        """Image plus caption tokens (the caption at its longest) times the guidance labels."""
        return self.geometry.step_tokens(params.width, params.height, params.guidance_scale)

    def first_walk(self, params: ZImageParams) -> str:
        return "encode_text"

    def next_walk(self, params: ZImageParams, finished: str) -> str | None:
        return "t2i" if finished == "encode_text" else None

    def warmup_requests(self, config: Any) -> list[ZImageParams]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.zimage.nodes import build_nodes

        return build_nodes(self.config, ctx)
