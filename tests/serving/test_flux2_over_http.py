"""Tiny FLUX.2 [klein] served end to end on CPU: a folder written by Flux2KleinPipeline's
save_pretrained, loaded by our node builders in the real Runtime's workers behind the real app on a
live server, driven by the official `openai` client: a generation and an edit with two reference
images, each within 40 dB of Flux2KleinPipeline on the same folder."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from mstar.api.app import create_app
from mstar.config import ServerConfig
from tests.api.live import LiveServer

KEY = "klein-key"
MIN_PSNR_DB = 40.0


def psnr_db(ours: np.ndarray, reference: np.ndarray) -> float:
    mse = np.mean((ours.astype(np.float64) - reference.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("diffusers")
    from diffusers import Flux2KleinPipeline

    from tests.models.flux2_klein.tiny_parts import TINY_SPEC_PATH, TinyFlux2KleinSpec, save_tiny_pipeline

    folder = tmp_path_factory.mktemp("flux2-klein-served")
    save_tiny_pipeline(folder, is_distilled=True)
    config = ServerConfig(
        model=TINY_SPEC_PATH, model_path=str(folder), api_key=KEY, compile_mode="off", warmup=False
    )
    with LiveServer(create_app(config, TinyFlux2KleinSpec())) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
        yield client, Flux2KleinPipeline.from_pretrained(str(folder)).to("cpu")


def pipeline_image(pipe, prompt, steps, seed, images=None, width=None, height=None) -> np.ndarray:
    from tests.models.flux2_klein.tiny_parts import pipeline_call_kwargs

    with torch.no_grad():
        return pipe(
            image=images, prompt=prompt, height=height, width=width, num_inference_steps=steps,
            generator=torch.Generator().manual_seed(seed), output_type="np", **pipeline_call_kwargs(),
        ).images[0]  # fmt: skip


def decoded(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")).astype(np.float64) / 255.0


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def test_generation_over_http_matches_the_pipeline(served):
    client, pipe = served
    result = client.images.generate(
        model="flux2-klein-4b", prompt="a lighthouse at dusk", size="48x64", response_format="b64_json",
        extra_body={"seed": 5, "num_inference_steps": 3},
    )  # fmt: skip
    assert result.size == "48x64"
    expected = pipeline_image(pipe, "a lighthouse at dusk", 3, 5, width=48, height=64)
    assert psnr_db(decoded(result.data[0].b64_json), expected) >= MIN_PSNR_DB


def test_edit_with_two_references_over_http_matches_the_pipeline(served):
    from tests.models.flux2_klein.test_generation import reference_images

    client, pipe = served
    images = reference_images()
    uploads = [(f"ref{i}.png", png_bytes(image), "image/png") for i, image in enumerate(images)]
    result = client.images.edit(
        model="flux2-klein-4b", image=uploads, prompt="put the cat on the sofa", response_format="b64_json",
        extra_body={"seed": 9, "num_inference_steps": 3},
    )  # fmt: skip
    assert result.size == "64x80"  # the first reference's size, as the pipeline's default
    expected = pipeline_image(pipe, "put the cat on the sofa", 3, 9, images=images)
    assert psnr_db(decoded(result.data[0].b64_json), expected) >= MIN_PSNR_DB
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.edit(model="flux2-klein-4b", image=[uploads[0]] * 5, prompt="too many")
    assert refused.value.body["param"] == "image"
