"""POST /generate: newline-delimited JSON progress, outputs, done; models and images details."""

from __future__ import annotations

import base64
import io
import json

import numpy as np
from PIL import Image

from mstar.api.media import decode_mp4
from tests.api.fakes import seeded_frames


def events(response) -> list[dict]:
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


def test_native_image_stream(image_client):
    client, runtime = image_client
    response = client.post(
        "/generate",
        json={
            "prompt": "a 5",
            "n": 2,
            "seed": 3,
            "num_inference_steps": 3,
            "width": 48,
            "height": 32,
            "output_format": "webp",
        },
    )
    assert response.status_code == 200
    stream = events(response)
    progress = [e for e in stream if e["type"] == "progress"]
    outputs = sorted((e for e in stream if e["type"] == "output"), key=lambda e: e["index"])
    assert {(e["index"], e["step"]) for e in progress} == {(i, s) for i in (0, 1) for s in (1, 2, 3)}
    assert stream[-1] == {"type": "done"}
    assert [e["seed"] for e in outputs] == [3, 4]
    for output in outputs:
        assert output["media_type"] == "image/webp" and (output["width"], output["height"]) == (48, 32)
        image = Image.open(io.BytesIO(base64.b64decode(output["data"])))
        assert image.format == "WEBP" and image.size == (48, 32)


def test_native_video_stream(video_client):
    client, runtime = video_client
    response = client.post("/generate", json={"prompt": "x", "num_frames": 5, "num_inference_steps": 2})
    stream = events(response)
    output = next(e for e in stream if e["type"] == "output")
    assert output["media_type"] == "video/mp4" and output["num_frames"] == 5
    assert decode_mp4(base64.b64decode(output["data"])).shape == (5, 32, 32, 3)


def test_native_video_muxed_from_pieces_is_the_same_file(video_client):
    client, runtime = video_client
    body = {"prompt": "x", "num_frames": 9, "num_inference_steps": 2, "seed": 5}
    outputs = []
    for piece_frames in (0, 2):  # whole, then in pieces of 2 frames as a VAE sends them
        runtime.piece_frames = piece_frames
        outputs.append(next(e for e in events(client.post("/generate", json=body)) if e["type"] == "output"))
    runtime.piece_frames = 0
    assert outputs[0] == outputs[1]
    assert (outputs[1]["num_frames"], outputs[1]["width"], outputs[1]["height"]) == (9, 32, 32)


def test_native_failure_is_an_error_line(image_client):
    client, runtime = image_client
    runtime.fail_kind = "error"
    try:
        stream = events(client.post("/generate", json={"prompt": "x", "num_inference_steps": 1}))
    finally:
        runtime.fail_kind = None
    assert stream[-1]["type"] == "error" and stream[-1]["error"]["type"] == "server_error"
    assert "deadbeef" not in json.dumps(stream)


def test_image_url_response_is_served_and_png_matches(image_client):
    client, runtime = image_client
    body = client.post(
        "/v1/images/generations", json={"prompt": "x", "response_format": "url", "seed": 9}
    ).json()
    url = body["data"][0]["url"]
    assert "/media/" in url and body["size"] == "32x32"
    image = client.get(url)
    assert image.headers["content-type"] == "image/png"
    expected = seeded_frames(runtime.submitted[-1][0])[0]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(image.content))), expected)
    assert client.get("/media/not-a-real-id").status_code == 404


def test_models_lists_task_and_limits(image_client):
    client, _ = image_client
    card = client.get("/v1/models").json()["data"][0]
    assert card["id"] == "fake-image" and card["task"] == "text-to-image"
    assert card["limits"]["max_num_inference_steps"] == 50
    assert client.get("/v1/models/fake-image").json() == card
