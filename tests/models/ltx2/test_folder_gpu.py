"""A real-size LTX-2 folder on the GPU: LTX2Pipeline with seeded random bf16 weights of the released
transformer, connectors, both VAEs and vocoder (and a 2-layer Gemma 3 of the 12B's width: the
parity hook's folder_config, which says why) written by save_pretrained, then served by
`mstar serve ltx-2 --model-path FOLDER --device cuda` (our loaders read every component) for one
short request with its soundtrack: the MP4 has H.264 frames and an AAC track as long as the video.

    python -m pytest -q -s -m gpu tests/models/ltx2/test_folder_gpu.py   # about 45 GB of disk

It prints the seconds the save, the boot and the request took. The folder is deleted at the end
(two of them would not fit the disk)."""

import shutil
import time

import pytest

from mstar.models.ltx2.presets import LTX2
from tests.models.ltx2.served_folder import check_soundtrack, generate_video, serve_folder

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
BOOT_TIMEOUT_S = 420.0  # loading about 45 GB and building five nodes, no compile
REQUEST_TIMEOUT_S = 180.0
REQUEST = {"model": "ltx-2", "prompt": "a red fox runs through fresh snow", "size": "256x256", "num_frames": 25,
           "fps": 24, "num_inference_steps": 2, "seed": 1}  # fmt: skip
SERVE_FLAGS = ("--device", "cuda", "--compile-mode", "off", "--no-warmup")


def test_real_size_folder_written_by_save_pretrained_is_served_with_model_path(tmp_path):
    pytest.importorskip("diffusers")
    import torch

    from mstar.models.ltx2.parity import folder_config, write_ltx2_folder

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    folder = tmp_path / "ltx2-real"
    try:
        started = time.perf_counter()
        write_ltx2_folder(folder_config(), folder, "cuda", seed=0)  # frees the device after the save
        saved = time.perf_counter()
        gib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30
        print(f"\nsave_pretrained: {gib:.1f} GiB in {saved - started:.0f} s")
        log = tmp_path / "server.log"
        with serve_folder("ltx-2", folder, log, *SERVE_FLAGS, boot_timeout_s=BOOT_TIMEOUT_S) as url:
            booted = time.perf_counter()
            job, mp4 = generate_video(url, REQUEST, REQUEST_TIMEOUT_S)
            done = time.perf_counter()
        print(
            f"boot to serving {booted - saved:.0f} s; one request {done - booted:.1f} s, MP4 {len(mp4)} bytes"
        )
        check_soundtrack(job, mp4, REQUEST, LTX2.vocoder.output_sampling_rate, LTX2.vocoder.out_channels)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
