"""Is our MP4 encode deterministic on this host? The same uint8 frames (noise, as random weights
give) encoded several times per x264 thread setting; prints distinct outputs and encode ms.

    python3 bench/mp4_determinism.py [NUM_REPEATS]
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import time

import av
import numpy as np

from mstar.api.media import encode_mp4


def encode_with_threads(frames: np.ndarray, fps: int, threads: str) -> bytes:
    """encode_mp4's settings with an explicit x264 thread count ("0" = x264's auto)."""
    num_frames, height, width, _ = frames.shape
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast", "threads": threads}
        for index in range(num_frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frames[index], format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def main() -> None:
    num_repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    frames = np.random.default_rng(0).integers(0, 256, (33, 480, 832, 3), dtype=np.uint8)
    print(f"host cores: {os.cpu_count()}, PyAV {av.__version__}")
    settings = {"encode_mp4": lambda: encode_mp4(frames, 16)}
    for threads in ("0", "1", "4", "8", "16"):
        settings[f"threads={threads}"] = lambda t=threads: encode_with_threads(frames, 16, t)
    for name, encode in settings.items():
        digests, times_ms = [], []
        for _ in range(num_repeats):
            started = time.perf_counter()
            digests.append(hashlib.sha256(encode()).hexdigest()[:12])
            times_ms.append(1000 * (time.perf_counter() - started))
        median_ms = sorted(times_ms)[len(times_ms) // 2]
        print(f"{name}: {len(set(digests))} distinct of {num_repeats} {digests}, median {median_ms:.0f} ms")


if __name__ == "__main__":
    main()
