"""Wan22Spec: defaults, limits, validation errors naming the field, walks; light import."""

import subprocess
import sys

import pytest

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams
from mstar.models.registry import get_model_spec
from mstar.models.wan22.model import Wan22Spec


def _validate(**fields):
    return Wan22Spec().validate(GenerationParams(prompt=fields.pop("prompt", "a cat"), **fields))


def test_defaults_are_the_shipped_settings():
    params = _validate(seed=3)
    assert (params.width, params.height, params.num_frames) == (1280, 704, 121)
    assert (params.fps, params.num_inference_steps, params.guidance_scale) == (24, 50, 5.0)
    assert params.negative_prompt == "" and params.seed == 3 and not params.image_to_video
    assert isinstance(_validate().seed, int)
    assert get_model_spec("wan2.2-ti2v-5b").name == "wan2.2-ti2v-5b"
    limits = Wan22Spec().limits()
    assert limits["width"]["multiple_of"] == 32 and limits["num_frames"]["form"] == "4k+1"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"width": 1000}, "width"),
        ({"height": 720}, "height"),
        ({"width": 0}, "width"),
        ({"width": 4096}, "width"),
        ({"num_frames": 120}, "num_frames"),
        ({"num_frames": 0}, "num_frames"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": 2.5}, "num_inference_steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"guidance_scale": True}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"fps": 0}, "fps"),
        ({"seconds": -2.0}, "seconds"),
        ({"seconds": 100.0}, "seconds"),
        ({"seconds": 2.0, "num_frames": 49}, "seconds"),
        ({"prompt": "  "}, "prompt"),
        ({"prompt": "x" * 9000}, "prompt"),
        ({"negative_prompt": 5}, "negative_prompt"),
    ],
)
def test_bad_fields_are_named(fields, param):
    with pytest.raises(InvalidParam) as error:
        _validate(**fields)
    assert error.value.param == param


def test_seconds_become_4k_plus_1_frames():
    assert _validate(seconds=5.0).num_frames == 121
    assert _validate(seconds=2.0, fps=16).num_frames == 33
    assert _validate(seconds=0.01).num_frames == 1
    assert _validate(seconds=1.1, fps=24).num_frames == 25  # 26.4 frames -> nearest 4k+1


def test_walks_follow_the_input():
    spec = Wan22Spec()
    t2v = _validate()
    i2v = spec.validate(GenerationParams(prompt="a cat", has_input_reference=True))
    assert spec.first_walk(t2v) == "encode_text"
    assert spec.next_walk(t2v, "encode_text") == "t2v" and spec.next_walk(t2v, "t2v") is None
    assert spec.next_walk(i2v, "encode_text") == "i2v" and spec.next_walk(i2v, "i2v") is None
    assert spec.walks["i2v"].nodes() == ("vae_encoder", "dit", "vae_decoder")
    assert set(spec.walks["t2v"].nodes()) <= set(spec.node_names)


def test_spec_import_does_not_load_torch():
    code = "import sys, mstar.models.wan22.model as m; m.Wan22Spec().limits(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"
