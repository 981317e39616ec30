"""Every registered model's spec behind the API (fake runtime): its route works with small settings,
the other media kind's route is a clear 400 (or, for a kind it also serves, works), and /v1/models shows its task and limits."""

from __future__ import annotations

import pytest

from mstar.api.service import route_kind, served_kinds
from mstar.models.registry import get_model_spec, model_names
from tests.api.conftest import build_client

SMALL_REQUEST = {
    "image": ("/v1/images/generations", {"prompt": "a 7", "num_inference_steps": 1, "seed": 1}),
    "video": ("/v1/videos", {"prompt": "a cat", "num_inference_steps": 1, "num_frames": 9, "size": "64x64"}),
}


@pytest.mark.parametrize("name", model_names())
def test_registered_model_behind_the_api(name):
    try:
        spec = get_model_spec(name)
    except ImportError as error:
        pytest.skip(f"{name} is not importable here: {error}")
    if spec.output_kind == "text" and name == "qwen3":  # no named size: a folder is required
        with pytest.raises(ValueError, match="--model-path"):
            build_client(spec)
        return
    client, runtime = build_client(spec)
    if spec.output_kind == "text":
        check_text_model(client, name, spec)
        return
    with client:
        kind = route_kind(spec.output_kind)
        path, body = SMALL_REQUEST[kind]
        steps = spec.limits()["num_inference_steps"]["min"]  # LTX-2's terminal shift needs two
        response = client.post(path, json={**body, "model": name, "num_inference_steps": steps})
        assert response.status_code == 200, response.text
        params, _ = runtime.submitted[-1]
        assert params.num_inference_steps == steps
        other_kind = "video" if kind == "image" else "image"
        other_path, other_body = SMALL_REQUEST[other_kind]
        other = client.post(other_path, json=other_body)
        if other_kind in spec.extra_media_kinds:  # a video model's image: its one-frame video
            assert other.status_code == 200, other.text
            assert runtime.submitted[-1][0].num_frames == 1
        else:
            assert other.status_code == 400 and other.json()["error"]["code"] == "unsupported_mode"
        card = client.get("/v1/models").json()["data"][0]
        assert card["id"] == name and card["task"] == spec.task and card["limits"] == spec.limits()
        assert card["media_kinds"] == list(served_kinds(spec))


def check_text_model(client, name, spec):
    """A text model: both media routes refuse it (unsupported_mode), the native route names the
    text routes, and /v1/models gives its context length. Its chat route runs in test_text_live."""
    with client:
        for path, body in SMALL_REQUEST.values():
            refused = client.post(path, json=body)
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_mode"
        native = client.post("/generate", json={"prompt": "hi"})
        assert native.status_code == 400 and "chat/completions" in native.json()["error"]["message"]
        card = client.get("/v1/models").json()["data"][0]
        assert card["id"] == name and card["task"] == "text-generation" and card["max_model_len"] > 0
