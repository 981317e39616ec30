"""The shared request checks: one message per failure, naming the field; bools never pass as ints."""

import pytest

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams
from mstar.models.validation import (
    check_prompts,
    check_single_image,
    guidance_in,
    int_in,
    multiple_in,
    sampling_limits,
    seed_or_random,
    steps_in,
)


def _error(call, *args) -> tuple[str, str]:
    with pytest.raises(InvalidParam) as caught:
        call(*args)
    return caught.value.param, caught.value.message


def test_int_checks_name_the_field_and_reject_bools():
    assert int_in("fps", None, 16, 1, 60) == 16
    assert int_in("fps", 60, 16, 1, 60) == 60
    assert _error(int_in, "fps", True, 16, 1, 60)[0] == "fps"
    assert _error(int_in, "fps", 61, 16, 1, 60) == ("fps", "must be in [1, 60], got 61")
    assert multiple_in("width", 64, 32, 16, 128, 16) == 64
    assert _error(multiple_in, "width", 72, 32, 16, 128, 16) == ("width", "must be a multiple of 16, got 72")
    assert _error(steps_in, 10, 4, 9) == ("num_inference_steps", "must be an integer in [1, 9], got 10")
    assert _error(steps_in, False, 4, 9)[0] == "num_inference_steps"


def test_guidance_and_seed():
    assert guidance_in(None, 0.0, 20.0) == 0.0
    assert guidance_in(3, 0.0, 20.0) == 3.0 and isinstance(guidance_in(3, 0.0, 20.0), float)
    assert _error(guidance_in, float("nan"), 0.0, 20.0) == (
        "guidance_scale",
        "must be a number in [0, 20.0], got nan",
    )
    assert seed_or_random(7) == 7
    assert 0 <= seed_or_random(None) < 2**32
    assert _error(seed_or_random, 2**63)[0] == "seed"


def test_prompt_and_single_image_checks():
    check_prompts(GenerationParams(prompt="a cat", negative_prompt=""), max_chars=5)
    assert _error(check_prompts, GenerationParams(prompt="  "), 5)[0] == "prompt"
    assert (
        _error(check_prompts, GenerationParams(prompt="a", negative_prompt="x" * 6), 5)[0]
        == "negative_prompt"
    )
    check_single_image(GenerationParams(prompt="a", num_frames=1), "m")
    assert _error(check_single_image, GenerationParams(prompt="a", num_frames=2), "m")[0] == "num_frames"
    param, message = _error(check_single_image, GenerationParams(prompt="a", has_input_reference=True), "m")
    assert param == "input_reference" and message == "m is text-to-image; no input image is taken"


def test_sampling_limits_keep_their_order():
    limits = sampling_limits(9, 50, 0.0, 20.0, 8192)
    assert list(limits) == ["num_inference_steps", "guidance_scale", "prompt"]
    assert limits["num_inference_steps"] == {"default": 9, "min": 1, "max": 50}
    assert limits["guidance_scale"] == {"default": 0.0, "min": 0.0, "max": 20.0}
