"""tiny-digits as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import). Walks: `encode_text` (word encoder: prompt and negative
prompt) then `t2i` (Loop(dit): the Wan DiT at a toy size under the shared DenoiseNode, flow-match
Euler steps; then decoder: 16x16 pixels -> "frames" uint8 [1, 256, 256, 3]). The weights ship in
the package (weights/), trained by `python -m mstar.models.tiny_digits.train`.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.tiny_digits.config import (
    CONFIG_FILE,
    IMAGE_SIZE,
    OUTPUT_SIZE,
    WEIGHTS_DIR,
    default_dit_config,
)
from mstar.models.warmup import sized_warmup_requests

MAX_STEPS = 100
MAX_GUIDANCE = 20.0
MAX_PROMPT_CHARS = 1000
MAX_SEED = 2**63 - 1


def _shipped_defaults() -> dict[str, Any]:
    """Sampling defaults and output size from weights/config.json (plain JSON, no torch)."""
    path = WEIGHTS_DIR / CONFIG_FILE
    shipped = json.loads(path.read_text()) if path.exists() else {}
    return {
        "output_size": shipped.get("output_size", OUTPUT_SIZE),
        "steps": shipped.get("default_steps", 20),
        "guidance_scale": shipped.get("default_guidance_scale", 3.5),
        "num_tokens": _num_tokens(shipped.get("image_size", IMAGE_SIZE), shipped.get("dit", {})),
    }


def _num_tokens(image_size: int, dit: dict[str, Any]) -> int:
    """DiT tokens of one image: a one-frame [C, 1, image_size, image_size] cut into patches."""
    _, patch_h, patch_w = dit.get("patch_size", default_dit_config()["patch_size"])
    return (image_size // patch_h) * (image_size // patch_w)


class TinyDigitsSpec(ModelSpec):
    name = "tiny-digits"
    task = "text-to-image"
    output_kind = "image"
    node_names = ("text_encoder", "dit", "decoder")
    walks = {
        "encode_text": Walk(
            "encode_text", ("text_encoder",), outputs=("prompt_embeds", "negative_prompt_embeds")
        ),
        "t2i": Walk("t2i", (Loop("dit"), "decoder"), outputs=("frames",)),
    }

    def __init__(self) -> None:
        defaults = _shipped_defaults()
        self.output_size: int = defaults["output_size"]
        self.default_steps: int = defaults["steps"]
        self.default_guidance: float = float(defaults["guidance_scale"])
        self.num_tokens: int = defaults["num_tokens"]

    @property
    def size(self) -> str:
        return f"{self.output_size}x{self.output_size}"

    def limits(self) -> dict[str, Any]:
        side = {"default": self.output_size, "min": self.output_size, "max": self.output_size}
        return {
            "sizes": [self.size],
            "width": side,
            "height": side,
            "num_inference_steps": {"default": self.default_steps, "min": 1, "max": MAX_STEPS},
            "guidance_scale": {"default": self.default_guidance, "min": 0.0, "max": MAX_GUIDANCE},
            "prompt": {"max_chars": MAX_PROMPT_CHARS},
            "num_frames": {"default": 1, "min": 1, "max": 1},
        }

    def validate(self, params: GenerationParams) -> dict[str, Any]:
        _check_prompt("prompt", params.prompt, required=True)
        if params.negative_prompt is not None:
            _check_prompt("negative_prompt", params.negative_prompt, required=False)
        if params.has_input_reference:
            raise InvalidParam("input_reference", "tiny-digits is text-to-image; no input image is taken")
        if params.num_frames not in (None, 1):
            raise InvalidParam(
                "num_frames", f"tiny-digits makes single images; got {params.num_frames} frames"
            )
        self._check_size(params.width, params.height)
        return {
            "prompt": params.prompt,
            "negative_prompt": params.negative_prompt or "",
            "width": self.output_size,
            "height": self.output_size,
            "num_inference_steps": _steps(params.num_inference_steps, self.default_steps),
            "guidance_scale": _guidance(params.guidance_scale, self.default_guidance),
            "seed": _seed(params.seed),
        }

    def _check_size(self, width: Any, height: Any) -> None:
        """The model was trained at one size: only the served size (or none) is accepted."""
        for value in (width, height):
            if value is not None and value != self.output_size:
                raise InvalidParam("size", f"tiny-digits only makes {self.size} images, got {width}x{height}")

    def step_tokens(self, params: dict[str, Any]) -> int:
        num_labels = 2 if float(params.get("guidance_scale") or 0.0) > 1.0 else 1  # as the dit's start
        return self.num_tokens * num_labels

    def first_walk(self, params: dict[str, Any]) -> str:
        return "encode_text"

    def next_walk(self, params: dict[str, Any], finished: str) -> str | None:
        return "t2i" if finished == "encode_text" else None

    def warmup_requests(self, config: Any) -> list[dict[str, Any]]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.tiny_digits.nodes import build_digits_nodes

        return build_digits_nodes(ctx)


def _check_prompt(field: str, prompt: Any, required: bool) -> None:
    if not isinstance(prompt, str):
        raise InvalidParam(field, "must be a string")
    if required and not prompt.strip():
        raise InvalidParam(field, "must not be empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidParam(field, f"at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _steps(value: Any, default: int) -> int:
    if value is None:
        return default
    if not _is_int(value) or not 1 <= value <= MAX_STEPS:
        raise InvalidParam("num_inference_steps", f"must be an integer in [1, {MAX_STEPS}], got {value!r}")
    return value


def _guidance(value: Any, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= MAX_GUIDANCE:
        raise InvalidParam("guidance_scale", f"must be a number in [0, {MAX_GUIDANCE}], got {value!r}")
    return float(value)


def _seed(value: Any) -> int:
    if value is None:
        return secrets.randbelow(2**32)
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        raise InvalidParam("seed", f"must be an integer in [0, 2**63 - 1], got {value!r}")
    return value
