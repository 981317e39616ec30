"""Deterministic mode: two FRESH servers give byte-identical outputs for the same request
and seed at c=1: tiny-digits through `mstar serve` subprocesses (PNG bytes over HTTP), tiny Z-Image
and a tiny Wan video through two Runtime instances (fresh worker processes each)."""

from __future__ import annotations

import asyncio
import base64
import signal

import httpx
import msgspec
import numpy as np
import pytest

from mstar.config import ServerConfig
from mstar.runtime.runtime import Runtime
from tests.api.test_cli import read_until, start_serve
from tests.serving.tiny_specs import TINY_WAN_PATH, TINY_ZIMAGE_PATH, TinyWanSpec, TinyZImageSpec

TIMEOUT_S = 60.0
DIGITS_BODY = {
    "model": "tiny-digits", "prompt": "the digit seven", "seed": 77, "num_inference_steps": 6,
    "response_format": "b64_json",
}  # fmt: skip


def png_from_a_fresh_server(*flags: str, boot_timeout_s: float = TIMEOUT_S) -> bytes:
    process = start_serve("tiny-digits", "--port", "0", *flags)
    try:
        lines = read_until(process.stdout, "mstar: serving", timeout_s=boot_timeout_s)
        base_url = lines[-1].split(" on ")[1].split()[0]
        response = httpx.post(f"{base_url}/v1/images/generations", json=DIGITS_BODY, timeout=TIMEOUT_S)
        assert response.status_code == 200, response.text
        return base64.b64decode(response.json()["data"][0]["b64_json"])
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def test_two_fresh_mstar_serve_processes_give_the_same_png_bytes():
    first, second = png_from_a_fresh_server(), png_from_a_fresh_server()
    assert first[:8] == b"\x89PNG\r\n\x1a\n"
    assert first == second


@pytest.mark.gpu
def test_two_fresh_servers_on_cuda_compiled_deterministic_give_the_same_png_bytes():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    flags = ("--device", "cuda", "--compile-mode", "deterministic")
    first, second = (png_from_a_fresh_server(*flags, boot_timeout_s=300.0) for _ in range(2))
    assert first == second


async def frames_from_a_fresh_runtime(config: ServerConfig, spec, params) -> np.ndarray:
    runtime = Runtime(config, spec)
    await runtime.start()
    try:
        outputs = await asyncio.wait_for(runtime.submit(params).result(), TIMEOUT_S)
    finally:
        await runtime.shutdown(timeout_s=5.0)
    return outputs["frames"]


CASES = {
    # Below the served minimum sizes (validate would refuse them): the tiny VAEs upsample little.
    "zimage": (TINY_ZIMAGE_PATH, TinyZImageSpec, {"width": 64, "height": 48, "guidance_scale": 2.0}),
    "wan22": (TINY_WAN_PATH, TinyWanSpec, {"width": 32, "height": 32, "num_frames": 5, "fps": 8,
                                           "guidance_scale": 4.0, "image_to_video": False}),
}  # fmt: skip


@pytest.mark.parametrize("model", sorted(CASES))
def test_two_fresh_runtimes_give_the_same_frame_bytes(model):
    path, spec_class, size = CASES[model]
    config = ServerConfig(model=path, random_weights=True, compile_mode="deterministic", warmup=False)
    params = {
        "prompt": "a red fox",
        "negative_prompt": "blurry",
        "num_inference_steps": 3,
        "seed": 21,
        **size,
    }
    spec = spec_class()
    params = msgspec.convert(params, spec.params_type)
    first, second = (asyncio.run(frames_from_a_fresh_runtime(config, spec, params)) for _ in range(2))
    assert first.dtype == np.uint8 and first.std() > 0  # a picture, not a constant
    assert first.tobytes() == second.tobytes()
