"""The API's media encodes on this host's CPU: PNG (Pillow at level 1 against mstar's parallel
writer) for a 1024x1024 image, and MP4 for a 33-frame 832x480 clip (x264 settings). Both run on
every image or video request's latency path. Prints the median ms of a few runs.

    python3 bench/encode_speed.py
"""

from __future__ import annotations

import importlib.util
import io
import os
import time

import numpy as np
from PIL import Image

from mstar.api.media import encode_mp4
from mstar.api.png import encode_png
from mstar.bench.stats import median


def median_ms(encode, num_runs: int = 5) -> tuple[float, int]:
    encode()
    times_s, size_bytes = [], 0
    for _ in range(num_runs):
        started = time.perf_counter()
        size_bytes = len(encode())
        times_s.append(time.perf_counter() - started)
    return 1000 * median(times_s), size_bytes


def pillow_png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:1024, 0:1024]
    smooth = np.stack([(x / 4) % 256, (y / 4) % 256, ((x + y) / 8) % 256], -1) + rng.integers(
        0, 3, (1024, 1024, 3)
    )
    return {
        "noise": rng.integers(0, 256, (1024, 1024, 3), dtype=np.uint8),
        "smooth": smooth.clip(0, 255).astype(np.uint8),
    }


def drifting_clip() -> np.ndarray:
    rng = np.random.default_rng(0)
    base = rng.normal(128, 40, (480, 832, 3))
    frames = [np.roll(base, t, axis=1) + rng.normal(0, 8, base.shape) for t in range(33)]
    return np.stack(frames).clip(0, 255).astype(np.uint8)


def main() -> None:
    print(f"host cores: {os.cpu_count()}")
    for name, image in images().items():
        for encoder_name, encode in (("pillow level 1", pillow_png), ("mstar png", encode_png)):
            ms, size_bytes = median_ms(lambda e=encode, i=image: e(i))
            print(f"png {name} 1024x1024, {encoder_name}: {ms:.1f} ms, {size_bytes / 1e6:.2f} MB")
    if importlib.util.find_spec("av") is None:
        print("mp4: skipped (PyAV is not installed here)")
        return
    clip = drifting_clip()
    ms, size_bytes = median_ms(lambda: encode_mp4(clip, fps=16), num_runs=3)
    print(f"mp4 832x480x33 (as served: veryfast, mbtree off): {ms:.0f} ms, {size_bytes / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
