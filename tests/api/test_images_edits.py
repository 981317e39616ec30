"""POST /v1/images/edits as OpenAI defines it, over the fake runtime with klein's (torch-free)
spec: multipart `image` / `image[]` and JSON data URLs, every refusal a 400 naming the field, the
images handed to the runtime as reference_0, reference_1, ... with their sizes in the params."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from tests.api.conftest import build_client
from tests.api.fakes import FakeImageSpec
from tests.models.flux2_klein.tiny_parts import TinyFlux2KleinSpec


def png(width: int, height: int, seed: int = 0, fmt: str = "PNG") -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


@pytest.fixture
def klein_client():
    client, runtime = build_client(TinyFlux2KleinSpec())
    with client:
        yield client, runtime


def post_files(client, files, **data):
    return client.post("/v1/images/edits", data={"prompt": "make it blue", **data}, files=files)


def error_param(response) -> str:
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


def test_two_uploads_reach_the_runtime_as_references_with_their_sizes(klein_client):
    client, runtime = klein_client
    files = [
        ("image[]", ("a.png", png(64, 80, 1), "image/png")),
        ("image[]", ("b.png", png(96, 64, 2), "image/png")),
    ]
    response = post_files(client, files, response_format="b64_json", seed="3")
    assert response.status_code == 200, response.text
    (params, inputs) = runtime.submitted[-1]
    assert params.reference_sizes == ((64, 80), (96, 64))
    assert (params.width, params.height) == (64, 80)  # the first reference's size by default
    assert sorted(inputs) == ["reference_0", "reference_1"]
    assert inputs["reference_1"].shape == (64, 96, 3) and inputs["reference_1"].dtype == np.uint8


def test_one_upload_as_image_and_a_json_data_url(klein_client):
    client, runtime = klein_client
    assert (
        post_files(client, [("image", ("a.png", png(64, 64), "image/png"))], size="32x32").status_code == 200
    )
    assert runtime.submitted[-1][0].reference_sizes == ((64, 64),)
    data_url = "data:image/png;base64," + base64.b64encode(png(72, 64)).decode()
    response = client.post("/v1/images/edits", json={"prompt": "p", "images": [{"image_url": data_url}]})
    assert response.status_code == 200, response.text
    assert runtime.submitted[-1][0].reference_sizes == ((72, 64),)


def test_refusals_name_the_field(klein_client):
    client, _ = klein_client
    ok = ("image[]", ("a.png", png(64, 64), "image/png"))
    five = [("image[]", (f"{i}.png", png(64, 64, i), "image/png")) for i in range(5)]
    assert error_param(post_files(client, five)) == "image"  # over the model's four
    gif = ("image[]", ("b.gif", png(64, 64, fmt="GIF"), "image/gif"))
    assert error_param(post_files(client, [ok, gif])) == "image[1]"  # not PNG, JPEG or WebP
    small = ("image[]", ("s.png", png(32, 64), "image/png"))
    assert error_param(post_files(client, [small, ok])) == "image[0]"  # below the 64-pixel side
    assert error_param(post_files(client, [])) == "image"
    mask = ("mask", ("m.png", png(64, 64), "image/png"))
    assert error_param(post_files(client, [ok, mask])) == "mask"
    remote = {"prompt": "p", "images": [{"image_url": "https://example.com/cat.png"}]}
    response = client.post("/v1/images/edits", json=remote)
    assert error_param(response) == "images.image_url"
    assert "not fetched" in response.json()["error"]["message"]


def test_a_model_without_references_refuses_edits():
    client, runtime = build_client(FakeImageSpec())
    with client:
        response = post_files(client, [("image", ("a.png", png(64, 64), "image/png"))])
    assert error_param(response) == "model" and "does not edit images" in response.json()["error"]["message"]
    assert runtime.submitted == []
