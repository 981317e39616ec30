"""TinyDigitsSpec: light import, walks, defaults and validation naming the field."""

import subprocess
import sys

import pytest

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams, Loop
from mstar.models.registry import get_model_spec
from mstar.models.tiny_digits.model import MAX_STEPS, DigitsParams, TinyDigitsSpec


def test_registry_returns_the_spec_and_import_stays_light():
    spec = get_model_spec("tiny-digits")
    assert isinstance(spec, TinyDigitsSpec)
    assert (spec.task, spec.output_kind, spec.output_tensor) == ("text-to-image", "image", "frames")
    code = "import sys, mstar.models.tiny_digits.model as m; m.TinyDigitsSpec().limits(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_walks_encode_text_then_loop_dit_then_decoder():
    spec = TinyDigitsSpec()
    params = spec.validate(GenerationParams(prompt="a handwritten 7"))
    assert spec.first_walk(params) == "encode_text"
    assert spec.next_walk(params, "encode_text") == "t2i"
    assert spec.next_walk(params, "t2i") is None
    assert spec.walks["t2i"].stages == (Loop("dit"), "decoder")
    assert spec.walks["t2i"].outputs == ("frames",)
    assert set(spec.node_names) == {n for walk in spec.walks.values() for n in walk.nodes()}


def test_defaults_are_resolved_into_the_typed_params():
    spec = TinyDigitsSpec()
    params = spec.validate(GenerationParams(prompt="seven", seed=3))
    assert params == DigitsParams(
        prompt="seven",
        negative_prompt="",
        width=256,
        height=256,
        num_inference_steps=spec.limits()["num_inference_steps"]["default"],
        guidance_scale=spec.limits()["guidance_scale"]["default"],
        seed=3,
    )
    assert spec.limits()["sizes"] == ["256x256"]
    assert 1.0 < params.guidance_scale <= 5.0
    unseeded = spec.validate(GenerationParams(prompt="seven"))
    assert isinstance(unseeded.seed, int) and unseeded.seed >= 0


def test_served_size_is_accepted_explicitly():
    params = TinyDigitsSpec().validate(GenerationParams(prompt="7", width=256, height=256, num_frames=1))
    assert (params.width, params.height) == (256, 256)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"width": 512, "height": 512}, "size"),
        ({"width": 256, "height": 128}, "size"),
        ({"width": 16}, "size"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": MAX_STEPS + 1}, "num_inference_steps"),
        ({"num_inference_steps": 2.5}, "num_inference_steps"),
        ({"num_inference_steps": True}, "num_inference_steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"guidance_scale": 1e9}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "7" * 5000}, "prompt"),
        ({"negative_prompt": "x" * 5000}, "negative_prompt"),
        ({"num_frames": 5}, "num_frames"),
        ({"has_input_reference": True}, "input_reference"),
    ],
)
def test_invalid_fields_are_named(fields, param):
    fields = {"prompt": "a handwritten 7", **fields}
    with pytest.raises(InvalidParam) as error:
        TinyDigitsSpec().validate(GenerationParams(**fields))
    assert error.value.param == param
