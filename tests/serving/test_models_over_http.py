"""Both big model families generate THROUGH THE SERVER on CPU: tiny Z-Image and tiny Wan2.2 weights
written by diffusers/transformers `save_pretrained` into diffusers-layout folders, loaded by the real
node builders in the real Runtime's worker processes, behind the real app on a live uvicorn server,
driven by the official `openai` client."""

from __future__ import annotations

import base64
import io
import json
import time

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from mstar.api.app import create_app
from mstar.api.media import decode_mp4
from mstar.config import ServerConfig
from tests.api.live import LiveServer
from tests.serving.tiny_specs import (
    SERVED_TINY_ZIMAGE_PATH,
    TINY_WAN_PATH,
    ServedTinyZImageSpec,
    TinyWanSpec,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks videos.* deprecated
KEY = "models-key"
MAX_VIDEO_WAIT_S = 60.0


def save_tiny_zimage(folder) -> None:
    pytest.importorskip("diffusers")
    from tests.models.zimage.tiny_parts import save_tiny_pipeline

    save_tiny_pipeline(folder)


def save_tiny_wan(folder) -> None:
    """transformer/, vae/, text_encoder/ and model_index.json; no tokenizer/ (the fallback is used)."""
    diffusers = pytest.importorskip("diffusers")
    transformers = pytest.importorskip("transformers")
    config = TinyWanSpec().config
    torch.manual_seed(0)
    diffusers.WanTransformer3DModel(**config.dit.to_dict()).save_pretrained(folder / "transformer")
    diffusers.AutoencoderKLWan(**config.vae).save_pretrained(folder / "vae")
    umt5 = transformers.UMT5EncoderModel(transformers.UMT5Config(**config.text_encoder))
    umt5.save_pretrained(folder / "text_encoder")
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))


def live_server(spec, spec_path: str, folder) -> LiveServer:
    config = ServerConfig(
        model=spec_path, model_path=str(folder), api_key=KEY, compile_mode="off", warmup=False
    )
    return LiveServer(create_app(config, spec))


def openai_client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


def test_zimage_generates_a_png_over_http(tmp_path):
    save_tiny_zimage(tmp_path)
    request = {
        "model": "z-image-turbo", "prompt": "a green hill", "size": "64x48", "response_format": "b64_json",
        "extra_body": {"seed": 5, "num_inference_steps": 2},
    }  # fmt: skip
    with live_server(ServedTinyZImageSpec(), SERVED_TINY_ZIMAGE_PATH, tmp_path) as server:
        client = openai_client(server)
        first = client.images.generate(**request)
        second = client.images.generate(**request)
    png = base64.b64decode(first.data[0].b64_json)
    image = np.asarray(Image.open(io.BytesIO(png)))
    assert png.startswith(b"\x89PNG") and first.size == "64x48"
    assert image.shape == (48, 64, 3) and image.std() > 0  # a picture, not a constant
    assert base64.b64decode(second.data[0].b64_json) == png, "same request and seed, same PNG bytes"


def test_wan_generates_an_mp4_over_http(tmp_path):
    save_tiny_wan(tmp_path)
    with live_server(TinyWanSpec(), TINY_WAN_PATH, tmp_path) as server:
        client = openai_client(server)
        video = client.videos.create(
            model="wan2.2-ti2v-5b", prompt="a red fox runs", size="32x48",
            extra_body={"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 7},
        )  # fmt: skip
        assert video.status == "queued" and video.size == "32x48"
        deadline = time.monotonic() + MAX_VIDEO_WAIT_S
        while video.status not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            video = client.videos.retrieve(video.id)
        assert video.status == "completed" and video.progress == 100, video
        mp4 = client.videos.download_content(video.id).read()
    frames = decode_mp4(mp4)  # PyAV
    assert frames.shape == (5, 48, 32, 3) and frames.std() > 0
