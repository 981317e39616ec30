"""tiny-digits through the HTTP server (create_app + real Runtime): 8 image requests in flight."""

import asyncio
import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from mstar.api.app import create_app
from mstar.config import ServerConfig
from mstar.models.tiny_digits import data
from mstar.models.tiny_digits.model import TinyDigitsSpec
from tests.api.live import LiveServer

NUM_IN_FLIGHT = 8
NUM_STEPS = 10
REQUEST_TIMEOUT_S = 60.0


def image_body(prompt: str, seed: int) -> dict:
    return {
        "model": "tiny-digits",
        "prompt": prompt,
        "size": "256x256",
        "seed": seed,
        "num_inference_steps": NUM_STEPS,
        "response_format": "b64_json",
    }


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(model="tiny-digits", warmup=False)
    with LiveServer(create_app(config, TinyDigitsSpec())) as live:
        yield live


async def post_all(base_url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        return await asyncio.gather(*(client.post("/v1/images/generations", json=body) for body in bodies))


def png_frames(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["size"] == "256x256"
    png = base64.b64decode(payload["data"][0]["b64_json"])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))[None]  # [1, 256, 256, 3]


def test_eight_in_flight_over_http_are_recognised(server):
    train_split, _ = data.load_splits()
    classifier = data.train_classifier(train_split)
    digits = [9, 8, 7, 6, 5, 4, 3, 2]
    bodies = [
        image_body(data.prompt_for(digit, index), seed=1000 + index) for index, digit in enumerate(digits)
    ]
    frames = [png_frames(r) for r in asyncio.run(post_all(server.base_url, bodies))]
    predicted = data.classify(classifier, data.ink_grid_from_frames(np.concatenate(frames)))
    assert (predicted == np.array(digits)).mean() >= 0.875, f"asked {digits}, got {predicted}"


def test_same_request_twice_is_byte_identical(server):
    # One at a time, so both ride alone (same seed, same batch company: same bytes). In other
    # company a CPU GEMM may round differently: at most 1/255 on a few pixels.
    body = image_body("the digit seven", seed=77)
    first, second = (png_frames(asyncio.run(post_all(server.base_url, [body]))[0]) for _ in range(2))
    assert first.tobytes() == second.tobytes()


def test_other_sizes_are_refused_naming_size(server):
    body = {"model": "tiny-digits", "prompt": "7", "size": "512x512"}
    response = httpx.post(f"{server.base_url}/v1/images/generations", json=body, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "size"
