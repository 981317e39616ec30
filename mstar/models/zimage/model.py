"""Z-Image-Turbo as the runtime sees it: walks, request limits, node building.

Light on purpose (no torch at import): the API process validates requests with this spec.
Walks: `encode_text` (Qwen3, prompt and, under guidance, negative prompt) then `t2i`
(Loop(dit) of flow-matching Euler steps, then vae_decoder -> "frames" uint8 [1, H, W, 3]).
"""

from __future__ import annotations

import secrets
from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, Walk
from mstar.models.warmup import sized_warmup_requests
from mstar.models.zimage.config import REAL, ZImageConfig

SIZE_MULTIPLE = 16  # VAE 8x times patch 2
SEQ_MULTI_OF = 32  # the DiT pads image and caption tokens to this multiple
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
MAX_SEED = 2**63 - 1


class ZImageSpec(ModelSpec):
    name = "z-image-turbo"
    task = "text-to-image"
    output_kind = "image"
    node_names = ("text_encoder", "dit", "vae_decoder")
    walks = {
        "encode_text": Walk("encode_text", ("text_encoder",)),
        "t2i": Walk("t2i", (Loop("dit"), "vae_decoder"), outputs=("frames",)),
    }

    def __init__(self, config: ZImageConfig = REAL):
        self.config = config

    def limits(self) -> dict[str, Any]:
        return {
            "width": {
                "default": DEFAULT_SIZE,
                "min": MIN_SIDE,
                "max": MAX_SIDE,
                "multiple_of": SIZE_MULTIPLE,
            },
            "height": {
                "default": DEFAULT_SIZE,
                "min": MIN_SIDE,
                "max": MAX_SIDE,
                "multiple_of": SIZE_MULTIPLE,
            },
            "pixels": {"min": MIN_PIXELS, "max": MAX_PIXELS},
            "num_inference_steps": {"default": DEFAULT_STEPS, "min": 1, "max": MAX_STEPS},
            "guidance_scale": {"default": DEFAULT_GUIDANCE, "min": 0.0, "max": MAX_GUIDANCE},
            "prompt": {"max_chars": MAX_PROMPT_CHARS},
            "num_frames": {"default": 1, "min": 1, "max": 1},
        }

    def validate(self, params: GenerationParams) -> dict[str, Any]:
        _check_prompt("prompt", params.prompt, required=True)
        if params.negative_prompt is not None:
            _check_prompt("negative_prompt", params.negative_prompt, required=False)
        if params.has_input_reference:
            raise InvalidParam("input_reference", "z-image-turbo is text-to-image; no input image is taken")
        if params.num_frames not in (None, 1):
            raise InvalidParam(
                "num_frames", f"z-image-turbo makes single images; got {params.num_frames} frames"
            )
        width = _side("width", params.width)
        height = _side("height", params.height)
        if not MIN_PIXELS <= width * height <= MAX_PIXELS:
            raise InvalidParam(
                "width", f"width*height must be in [{MIN_PIXELS}, {MAX_PIXELS}] pixels, got {width}x{height}"
            )
        return {
            "prompt": params.prompt,
            "negative_prompt": params.negative_prompt or "",
            "width": width,
            "height": height,
            "num_inference_steps": _steps(params.num_inference_steps),
            "guidance_scale": _guidance(params.guidance_scale),
            "seed": _seed(params.seed),
        }

    def step_tokens(self, params: dict[str, Any]) -> int:
        """Image plus caption tokens (the caption at its longest) times the guidance labels."""
        config = self.config
        patch = config.dit.patch_size
        latent_scale = config.vae.spatial_scale * patch  # pixels per token side
        num_image = (params["height"] // latent_scale) * (params["width"] // latent_scale)
        num_tokens = _padded(num_image) + _padded(config.max_sequence_length)
        num_labels = 2 if float(params.get("guidance_scale") or 0.0) > 0.0 else 1  # as uses_guidance
        return num_tokens * num_labels

    def first_walk(self, params: dict[str, Any]) -> str:
        return "encode_text"

    def next_walk(self, params: dict[str, Any], finished: str) -> str | None:
        return "t2i" if finished == "encode_text" else None

    def warmup_requests(self, config: Any) -> list[dict[str, Any]]:
        return sized_warmup_requests(self, config.compile_sizes) if config.warmup else []

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        from mstar.models.zimage.nodes import build_nodes

        return build_nodes(self.config, ctx)


def _check_prompt(field: str, prompt: Any, required: bool) -> None:
    if not isinstance(prompt, str):
        raise InvalidParam(field, "must be a string")
    if required and not prompt.strip():
        raise InvalidParam(field, "must not be empty")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidParam(field, f"at most {MAX_PROMPT_CHARS} characters, got {len(prompt)}")


def _padded(num_tokens: int) -> int:
    """Rounded up to the DiT's sequence multiple (zimage.dit.SEQ_MULTI_OF, kept torch-free here)."""
    return num_tokens + (-num_tokens) % SEQ_MULTI_OF


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _side(field: str, value: int | None) -> int:
    if value is None:
        return DEFAULT_SIZE
    if not _is_int(value):
        raise InvalidParam(field, f"must be an integer, got {value!r}")
    if not MIN_SIDE <= value <= MAX_SIDE:
        raise InvalidParam(field, f"must be in [{MIN_SIDE}, {MAX_SIDE}], got {value}")
    if value % SIZE_MULTIPLE:
        raise InvalidParam(field, f"must be a multiple of {SIZE_MULTIPLE}, got {value}")
    return value


def _steps(value: int | None) -> int:
    if value is None:
        return DEFAULT_STEPS
    if not _is_int(value) or not 1 <= value <= MAX_STEPS:
        raise InvalidParam("num_inference_steps", f"must be an integer in [1, {MAX_STEPS}], got {value!r}")
    return value


def _guidance(value: float | None) -> float:
    if value is None:
        return DEFAULT_GUIDANCE
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= MAX_GUIDANCE:
        raise InvalidParam("guidance_scale", f"must be a number in [0, {MAX_GUIDANCE}], got {value!r}")
    return float(value)


def _seed(value: int | None) -> int:
    if value is None:
        return secrets.randbelow(2**32)
    if not _is_int(value) or not 0 <= value <= MAX_SEED:
        raise InvalidParam("seed", f"must be an integer in [0, 2**63 - 1], got {value!r}")
    return value
