"""ZImageSpec: registry entry, walks, defaults and request validation (no torch needed)."""

import subprocess
import sys

import pytest

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams, Loop
from mstar.models.registry import get_model_spec
from mstar.models.zimage.model import ZImageParams, ZImageSpec


def test_registry_name_resolves_to_spec():
    spec = get_model_spec("z-image-turbo")
    assert isinstance(spec, ZImageSpec)
    assert spec.task == "text-to-image" and spec.output_kind == "image"


def test_walk_order_and_nodes():
    spec = ZImageSpec()
    assert spec.first_walk({}) == "encode_text"
    assert spec.next_walk({}, "encode_text") == "t2i"
    assert spec.next_walk({}, "t2i") is None
    assert spec.walks["t2i"].stages == (Loop("dit"), "vae_decoder")
    assert spec.walks["t2i"].outputs == ("frames",)
    walk_nodes = {n for walk in spec.walks.values() for n in walk.nodes()}
    assert walk_nodes == set(spec.node_names)


def test_defaults_follow_the_turbo_recipe():
    params = ZImageSpec().validate(GenerationParams(prompt="a lighthouse", seed=7))
    assert params == ZImageParams(
        prompt="a lighthouse", negative_prompt="", width=1024, height=1024,
        num_inference_steps=9, guidance_scale=0.0, seed=7,
    )  # fmt: skip


def test_missing_seed_gets_a_fresh_one():
    params = ZImageSpec().validate(GenerationParams(prompt="x"))
    assert isinstance(params.seed, int) and 0 <= params.seed < 2**32


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 9000}, "prompt"),
        ({"width": 1000}, "width"),
        ({"height": 32}, "height"),
        ({"width": 4096, "height": 4096}, "width"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": 51}, "num_inference_steps"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"seed": -1}, "seed"),
        ({"num_frames": 5}, "num_frames"),
        ({"has_input_reference": True}, "input_reference"),
    ],
)
def test_invalid_fields_are_named(overrides, field):
    fields = {"prompt": "a cat", **overrides}
    with pytest.raises(InvalidParam) as raised:
        ZImageSpec().validate(GenerationParams(**fields))
    assert raised.value.param == field


def test_importing_the_spec_does_not_import_torch():
    code = "import sys, mstar.models.zimage.model as m; m.ZImageSpec(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_limits_agree_with_validation():
    spec = ZImageSpec()
    limits = spec.limits()
    params = spec.validate(GenerationParams(prompt="x", seed=1))
    for field in ("width", "height", "num_inference_steps", "guidance_scale"):
        assert getattr(params, field) == limits[field]["default"]
    largest = limits["pixels"]["max"]
    side = int(largest**0.5)
    assert spec.validate(GenerationParams(prompt="x", width=side, height=side)).width == side
    with pytest.raises(InvalidParam):
        spec.validate(GenerationParams(prompt="x", width=side + 16, height=side))
