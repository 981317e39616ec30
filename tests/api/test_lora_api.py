"""The `lora` field on the image, video and native routes and GET /v1/loras: only names from the
server's lora_dir, checked scale, count and rank; every refusal is a 400 naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS
from mstar.params import LoraChoice, decode_params, encode_params
from tests.api.conftest import build_client, wait_for
from tests.api.fakes import FakeImageSpec, FakeVideoSpec
from tests.lora_files import write_adapter

IMAGES = "/v1/images/generations"
VALID = {"prompt": "a cat", "num_inference_steps": 1}


class LoraImageSpec(FakeImageSpec):
    lora_keys = ZIMAGE_LORA_KEYS


class LoraVideoSpec(FakeVideoSpec):
    lora_keys = WAN22_LORA_KEYS


def _pair(module: str, rank: int, features: int = 8) -> dict[str, torch.Tensor]:
    return {
        f"transformer.{module}.lora_A.weight": torch.zeros(rank, features),
        f"transformer.{module}.lora_B.weight": torch.zeros(features, rank),
    }


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("loras")
    write_adapter(str(folder / "style.safetensors"), _pair("layers.0.attention.to_q", 4))
    write_adapter(
        str(folder / "detail" / "pytorch_lora_weights.safetensors"), _pair("layers.1.feed_forward.w1", 8)
    )
    write_adapter(str(folder / "big.safetensors"), _pair("layers.0.attention.to_k", 16))
    write_adapter(str(folder / "motion.safetensors"), _pair("blocks.0.attn1.to_q", 4))
    (folder / "broken.safetensors").write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00oops")
    (folder / "notes.txt").write_text("not an adapter")
    return folder


@pytest.fixture
def client(lora_dir):
    client, runtime = build_client(LoraImageSpec(), lora_dir=str(lora_dir), max_lora_rank=8)
    with client:
        yield client, runtime


def _error(response):
    assert response.status_code == 400, response.text
    return response.json()["error"]


def test_adapters_reach_the_params(client):
    client, runtime = client
    body = {**VALID, "lora": [{"name": "style", "scale": 0.8}, {"name": "detail"}], "n": 2}
    assert client.post(IMAGES, json=body).status_code == 200
    for params, _ in runtime.submitted:
        assert params.lora == (LoraChoice("style", 0.8), LoraChoice("detail", 1.0))
    assert client.post(IMAGES, json=VALID).status_code == 200
    assert runtime.submitted[-1][0].lora == ()  # no adapters


@pytest.mark.parametrize(
    "lora, param, words",
    [
        ([{"name": "style"}, {"name": "nope"}], "lora[1].name", "no adapter 'nope'"),
        ([{"name": "../style"}], "lora[0].name", "no adapter"),
        ([{"name": "/etc/passwd"}], "lora[0].name", "no adapter"),
        ([{"name": "style", "scale": 11}], "lora[0].scale", "less than or equal"),
        ([{"name": "style", "scale": -10.5}], "lora[0].scale", "greater than or equal"),
        ([{"name": "style", "scale": True}], "lora[0].scale", "boolean"),
        ([{"name": "style"}, {"name": "detail"}, {"name": "big"}], "lora", "at most 2 adapters"),
        ([{"name": "big"}], "lora[0].name", "rank 16, above this server's max_lora_rank of 8"),
        ([{"name": "motion"}], "lora[0].name", "is for wan2.2"),
        ([{"name": "style"}, {"name": "style"}], "lora[1].name", "named twice"),
        ([{"name": "broken"}], "lora[0].name", "cannot be used"),
        ([{"name": "style", "path": "/x"}], "lora[0].path", "unknown field"),
        ([{"scale": 1.0}], "lora[0].name", "required"),
        ("style", "lora", "JSON list"),
    ],
)
def test_bad_adapters_are_400_naming_the_field(client, lora, param, words):
    client, runtime = client
    error = _error(client.post(IMAGES, json={**VALID, "lora": lora}))
    assert error["param"] == param and words in error["message"], error
    assert runtime.submitted == []


def test_nan_scale_is_refused(client):
    client, _ = client
    body = json.dumps({**VALID, "lora": [{"name": "style", "scale": float("nan")}]})
    error = _error(client.post(IMAGES, content=body, headers={"content-type": "application/json"}))
    assert error["param"] == "lora[0].scale"


def test_list_loras(client):
    client, _ = client
    cards = {card["id"]: card for card in client.get("/v1/loras").json()["data"]}
    assert sorted(cards) == ["big", "broken", "detail", "motion", "style"]
    assert cards["style"]["rank"] == 4 and cards["style"]["family"] == "z-image"
    assert cards["detail"]["rank"] == 8 and cards["motion"]["family"] == "wan2.2"
    assert not cards["style"]["loaded"] and "error" in cards["broken"]


def test_models_without_lora_or_without_a_folder_refuse_it(lora_dir):
    for spec, fields in ((FakeImageSpec(), {"lora_dir": str(lora_dir)}), (LoraImageSpec(), {})):
        client, _ = build_client(spec, **fields)
        with client:
            error = _error(client.post(IMAGES, json={**VALID, "lora": [{"name": "style"}]}))
            assert error["param"] == "lora"
            assert bool(client.get("/v1/loras").json()["data"]) == bool(fields)  # no folder: none listed


def test_video_and_native_routes_take_lora(lora_dir):
    client, runtime = build_client(LoraVideoSpec(), lora_dir=str(lora_dir))
    with client:
        body = {"prompt": "a cat", "num_inference_steps": 1, "num_frames": 5}
        created = client.post("/v1/videos", json={**body, "lora": [{"name": "motion", "scale": 0.5}]})
        assert created.status_code == 200, created.text
        wait_for(client, created.json()["id"])
        form = {"prompt": "a cat", "num_frames": "5", "lora": json.dumps([{"name": "motion"}])}
        assert client.post("/v1/videos", data=form).status_code == 200
        native = client.post("/generate", json={**body, "lora": [{"name": "motion", "scale": -1}]})
        assert native.status_code == 200
        assert [p.lora for p, _ in runtime.submitted] == [
            (LoraChoice("motion", 0.5),),
            (LoraChoice("motion", 1.0),),
            (LoraChoice("motion", -1.0),),
        ]
        error = _error(client.post("/v1/videos", json={**body, "lora": [{"name": "style"}]}))
        assert error["param"] == "lora[0].name" and "z-image" in error["message"]


def test_adapters_travel_in_the_typed_params(client):
    """The checked adapters ride to the workers inside the params Struct (msgpack), typed."""
    client, runtime = client
    body = {**VALID, "lora": [{"name": "style", "scale": 0.8}]}
    assert client.post(IMAGES, json=body).status_code == 200
    params, _ = runtime.submitted[-1]
    decoded = decode_params(encode_params(params), type(params))
    assert decoded == params and decoded.lora == (LoraChoice("style", 0.8),)
