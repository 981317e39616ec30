"""tiny-digits as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import). Walks: `encode_text` (word encoder: prompt and negative
prompt) then `t2i` (Loop(dit): the Wan DiT at a toy size under the shared DenoiseNode, flow-match
Euler steps; then decoder: 16x16 pixels -> "frames" uint8 [1, 256, 256, 3]). The weights ship in
the package (weights/), trained by `python -m mstar.models.tiny_digits.train`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.tiny_digits.config import CONFIG_FILE, WEIGHTS_DIR, TinyDigitsConfig
from mstar.models.tiny_digits.geometry import DigitsGeometry
from mstar.models.validation import (
    check_prompts,
    check_single_image,
    guidance_in,
    range_limit,
    sampling_limits,
    seed_or_random,
    single_frame_limit,
    steps_in,
)
from mstar.models.warmup import sized_warmup_requests
from mstar.params import ImageParams

MAX_STEPS = 100
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 1000


def _shipped() -> dict[str, Any]:
    """weights/config.json (plain JSON, no torch), the defaults where it is absent."""
    path = WEIGHTS_DIR / CONFIG_FILE
    return json.loads(path.read_text()) if path.exists() else asdict(TinyDigitsConfig())


class DigitsParams(ImageParams, kw_only=True):
    """A tiny-digits request (always the served size)."""


class TinyDigitsSpec(ModelSpec):
    name = "tiny-digits"
    task = "text-to-image"
    output_kind = "image"
    params_type = DigitsParams
    node_names = ("text_encoder", "dit", "decoder")
    walks = {
        "encode_text": Walk(
            "encode_text", ("text_encoder",), outputs=("prompt_embeds", "negative_prompt_embeds")
        ),
        "t2i": Walk("t2i", (Loop("dit"), "decoder"), outputs=("frames",)),
    }

    def __init__(self) -> None:
        shipped = _shipped()
        self.geometry = DigitsGeometry.of(shipped)
        self.output_size: int = shipped["output_size"]
        self.default_steps: int = shipped["default_steps"]
        self.default_guidance: float = float(shipped["default_guidance_scale"])

    @property
    def size(self) -> str:
        return f"{self.output_size}x{self.output_size}"

    def limits(self) -> dict[str, Any]:
        side = range_limit(self.output_size, self.output_size, self.output_size)
        return {
            "sizes": [self.size],
            "width": side,
            "height": side,
            **sampling_limits(
                self.default_steps, MAX_STEPS, self.default_guidance, MAX_GUIDANCE, MAX_PROMPT_CHARS
            ),
            "num_frames": single_frame_limit(),
        }

    def validate(self, params: GenerationParams) -> DigitsParams:
        check_prompts(params, MAX_PROMPT_CHARS)
        check_single_image(params, self.name)
        self._check_size(params.width, params.height)
        return DigitsParams(
            prompt=params.prompt,
            negative_prompt=params.negative_prompt or "",
            width=self.output_size,
            height=self.output_size,
            num_inference_steps=steps_in(params.num_inference_steps, self.default_steps, MAX_STEPS),
            guidance_scale=guidance_in(params.guidance_scale, self.default_guidance, MAX_GUIDANCE),
            seed=seed_or_random(params.seed),
        )

    def _check_size(self, width: Any, height: Any) -> None:
        """The model was trained at one size: only the served size (or none) is accepted."""
        for value in (width, height):
            if value is not None and value != self.output_size:
                raise InvalidParam("size", f"tiny-digits only makes {self.size} images, got {width}x{height}")

    def step_tokens(self, params: DigitsParams) -> int:
        return self.geometry.step_tokens(params.guidance_scale)

    def first_walk(self, params: DigitsParams) -> str:
        return "encode_text"

    def next_walk(self, params: DigitsParams, finished: str) -> str | None:
        return "t2i" if finished == "encode_text" else None

    def warmup_requests(self, config: Any) -> list[DigitsParams]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.tiny_digits.nodes import build_nodes

        return build_nodes(ctx)
