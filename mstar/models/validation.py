"""Request checks and limit entries shared by the model specs' validate() and limits().

Light on purpose (no torch at import): the API process validates requests with the specs. Each spec
keeps its own bounds and passes them in; the messages and `param` names here are the API's contract
(tests/api/test_errors.py and the model spec tests assert them).
"""

from __future__ import annotations

import secrets
from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams

MAX_SEED = 2**63 - 1


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON true/false must not pass as 1/0)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_prompt(field: str, prompt: Any, required: bool, max_chars: int) -> None:
    if not isinstance(prompt, str):
        raise InvalidParam(field, "must be a string")
    if required and not prompt.strip():
        raise InvalidParam(field, "must not be empty")
    if len(prompt) > max_chars:
        raise InvalidParam(field, f"at most {max_chars} characters, got {len(prompt)}")


def check_prompts(params: GenerationParams, max_chars: int) -> None:
    """The prompt (required, not blank) and the optional negative prompt."""
    check_prompt("prompt", params.prompt, required=True, max_chars=max_chars)
    if params.negative_prompt is not None:
        check_prompt("negative_prompt", params.negative_prompt, required=False, max_chars=max_chars)


def check_single_image(params: GenerationParams, model_name: str) -> None:
    """Text-to-image models take no input image and make exactly one frame."""
    if params.has_input_reference:
        raise InvalidParam("input_reference", f"{model_name} is text-to-image; no input image is taken")
    if params.num_frames not in (None, 1):
        raise InvalidParam("num_frames", f"{model_name} makes single images; got {params.num_frames} frames")


def int_in(field: str, value: Any, default: int, minimum: int, maximum: int) -> int:
    """`value` (or `default` when absent) as an integer in [minimum, maximum]."""
    if value is None:
        return default
    if not is_int(value):
        raise InvalidParam(field, f"must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise InvalidParam(field, f"must be in [{minimum}, {maximum}], got {value}")
    return value


def multiple_in(field: str, value: Any, default: int, minimum: int, maximum: int, multiple: int) -> int:
    """As int_in, and a multiple of `multiple` (image sides: VAE scale times patch size)."""
    value = int_in(field, value, default, minimum, maximum)
    if value % multiple:
        raise InvalidParam(field, f"must be a multiple of {multiple}, got {value}")
    return value


def steps_in(value: Any, default: int, max_steps: int) -> int:
    """num_inference_steps in [1, max_steps], one message for type and range."""
    if value is None:
        return default
    if not is_int(value) or not 1 <= value <= max_steps:
        raise InvalidParam("num_inference_steps", f"must be an integer in [1, {max_steps}], got {value!r}")
    return value


def guidance_in(value: Any, default: float, max_guidance: float) -> float:
    """guidance_scale in [0, max_guidance]; `default` is returned as given when absent."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= max_guidance:
        raise InvalidParam("guidance_scale", f"must be a number in [0, {max_guidance}], got {value!r}")
    return float(value)


def seed_or_random(value: Any) -> int:
    """The request's seed, or a fresh random one below 2**32 when absent."""
    if value is None:
        return secrets.randbelow(2**32)
    if not is_int(value) or not 0 <= value <= MAX_SEED:
        raise InvalidParam("seed", f"must be an integer in [0, 2**63 - 1], got {value!r}")
    return value


def range_limit(default: Any, minimum: Any, maximum: Any) -> dict[str, Any]:
    return {"default": default, "min": minimum, "max": maximum}


def sampling_limits(
    default_steps: int, max_steps: int, default_guidance: float, max_guidance: float, max_prompt_chars: int
) -> dict[str, Any]:
    """The limits() entries every spec has: steps, guidance scale and prompt length."""
    return {
        "num_inference_steps": range_limit(default_steps, 1, max_steps),
        "guidance_scale": range_limit(default_guidance, 0.0, max_guidance),
        "prompt": {"max_chars": max_prompt_chars},
    }


def single_frame_limit() -> dict[str, Any]:
    """limits()["num_frames"] of an image model: exactly one frame."""
    return range_limit(1, 1, 1)
