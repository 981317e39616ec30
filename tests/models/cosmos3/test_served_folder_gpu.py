"""Real-size Cosmos3-Edge on a GPU, from a folder as users have one: Cosmos3OmniPipeline written with
save_pretrained (seeded random weights; the transformer in bf16 with its float32 time embedder, the
Wan VAE in float32 as its checkpoint, the offline tokenizer), then `mstar serve cosmos3-edge
--model-path FOLDER` in its own process (eager and without warmup: the loaders and the served path
are what is tested, not the compile). An image over /v1/images/generations (PNG, lossless) against
the pipeline on the same folder; text-to-video at the recipe's 832x480x121 and image-to-video over
/v1/videos (MP4: frames decoded, needs PyAV).

    python -m pytest -q -m gpu tests/models/cosmos3/test_served_folder_gpu.py    # ~3 min on an H200
"""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[3]
BOOT_TIMEOUT_S = 300.0  # a 6 GB folder read, the KV pool, no compile
REQUEST_TIMEOUT_S = 300.0
STEPS = 2
MIN_IMAGE_PSNR_DB = 25.0  # bf16 against the pipeline's bf16; wrong weights or layout give ~10 dB
MODEL, DEVICE = "cosmos3-edge", "cuda"
IMAGE_SIDE, VIDEO_SIZE, VIDEO_FRAMES, I2V_FRAMES = 640, (832, 480), 121, 33  # the recipe's sizes
IMAGE = {"prompt": "a red cube on a wooden table", "size": f"{IMAGE_SIDE}x{IMAGE_SIDE}", "seed": 3}


def folder_config():
    from mstar.models.cosmos3.config import Cosmos3Config

    return Cosmos3Config()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("diffusers")
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from mstar.models.cosmos3.parity import write_folder

    path = tmp_path_factory.mktemp("cosmos3-edge-real")
    write_folder(folder_config(), path, DEVICE, seed=0)  # the recipe's flow shift in its scheduler
    return path


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    """The base URL of `mstar serve cosmos3-edge --model-path FOLDER` (its log in a file: a pipe
    nobody reads would fill and stall the server)."""
    log = tmp_path_factory.mktemp("cosmos3-server") / "server.log"
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path}
    env.pop("MSTAR_API_KEY", None)
    args = [MODEL, "--model-path", str(folder), "--device", DEVICE, "--port", "0",
            "--compile-mode", "off", "--no-warmup"]  # fmt: skip
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mstar.cli", "serve", *args], cwd=REPO, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield _wait_until_serving(process, log)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _wait_until_serving(process: subprocess.Popen, log: Path) -> str:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("mstar: serving"):
                return line.split(" on ")[1].split()[0]
        if process.poll() is not None:
            break
        time.sleep(1.0)
    tail = "\n".join(log.read_text(errors="replace").replace("\r", "\n").splitlines()[-30:])
    raise AssertionError(f"the server did not start (exit {process.poll()}); its log ends:\n{tail}")


def _client(base_url: str):
    import httpx

    return httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S)


def test_an_image_from_the_served_folder_matches_the_pipeline_on_it(folder, server):
    import torch
    from PIL import Image

    from mstar.bench.parity import other_attention_kernels, psnr_db
    from mstar.models.cosmos3.parity import load_reference, run_pipeline

    body = {**IMAGE, "model": MODEL, "response_format": "b64_json", "num_inference_steps": STEPS}
    with _client(server) as client:
        response = client.post("/v1/images/generations", json=body)
    assert response.status_code == 200, response.text
    png = base64.b64decode(response.json()["data"][0]["b64_json"])
    ours = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    assert ours.shape == (IMAGE_SIDE, IMAGE_SIDE, 3) and ours.std() > 0

    pipe = load_reference(folder, DEVICE)
    fields = {"prompt": IMAGE["prompt"], "num_frames": 1, "height": IMAGE_SIDE, "width": IMAGE_SIDE, "fps": 24,
              "num_inference_steps": STEPS, "guidance_scale": 6.0, "seed": IMAGE["seed"]}  # fmt: skip
    with torch.inference_mode():
        theirs = run_pipeline(pipe, fields, "np")
        with other_attention_kernels(DEVICE):
            yardstick = psnr_db(run_pipeline(pipe, fields, "np"), theirs)
    ours_db = psnr_db(ours, theirs)
    assert ours_db >= MIN_IMAGE_PSNR_DB, f"{ours_db:.1f} dB (the pipeline against itself: {yardstick:.1f} dB)"


def _video(client, body: dict) -> bytes:
    created = client.post("/v1/videos", json={"model": MODEL, "num_inference_steps": STEPS, **body})
    assert created.status_code == 200, created.text
    video_id = created.json()["id"]
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while time.monotonic() < deadline:
        job = client.get(f"/v1/videos/{video_id}").json()
        if job["status"] in ("completed", "failed"):
            break
        time.sleep(0.5)
    assert job["status"] == "completed", job
    return client.get(f"/v1/videos/{video_id}/content").content


def test_text_and_image_to_video_from_the_served_folder(server):
    pytest.importorskip("av")
    from PIL import Image

    from mstar.api.media import decode_mp4

    width, height = VIDEO_SIZE
    picture = np.random.default_rng(0).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(picture).save(encoded, format="PNG")
    reference = "data:image/png;base64," + base64.b64encode(encoded.getvalue()).decode()
    with _client(server) as client:
        size = f"{width}x{height}"
        t2v = decode_mp4(_video(client, {"prompt": "a robot arm pours water", "size": size,
                                         "num_frames": VIDEO_FRAMES, "seed": 1}))  # fmt: skip
        i2v = decode_mp4(_video(client, {"prompt": "the scene comes alive", "size": size,
                                         "num_frames": I2V_FRAMES, "seed": 2, "input_reference": reference}))  # fmt: skip
        metrics = client.get("/metrics").text
    assert t2v.shape == (VIDEO_FRAMES, height, width, 3) and t2v.std() > 0
    assert i2v.shape == (I2V_FRAMES, height, width, 3) and i2v.std() > 0
    assert "understanding_forwards" in metrics  # the dit node's counters reach /metrics
