"""The API's media encodes on this host's CPU: PNG (Pillow at level 1 against mstar's parallel
writer) for a 1024x1024 image, and MP4 for a 33-frame 832x480 clip (x264 settings). Both run on
every image or video request's latency path. Prints the median ms of a few runs.

The MP4 runs at several x264 thread counts, whole and streamed: the clip comes in Wan's VAE chunks
(1 frame, then 4 at a time) every `PIECE_INTERVAL_S`, as the server muxes them while the VAE
decodes, and the "tail" is what the request still waits once the last chunk is in: the flush.
The served settings also run through the API's own muxing path (`routes_videos.mux_video`: each
piece handed to a thread as an event of the request's stream), with a generator that plays the
runtime's part: the server's tail without the model.

    python3 bench/encode_speed.py [--mp4-only] [--thread-counts]
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import sys
import time

import numpy as np
from PIL import Image

from mstar.api import media
from mstar.api.media import Mp4Writer, encode_mp4
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


PIECE_INTERVAL_S = 0.045  # Wan 832x480x33's VAE decode: about 412 ms over 9 latent chunks
THREAD_COUNTS = (1, 2, 4, 8, 0)  # 0: x264's automatic count (it follows the cores)
# Other x264 settings, as (threads, thread type, x264-params). x264 holds back its B-frames (+ frame
# threads - 1 + sync-lookahead with frame threads) before it starts a frame, so at the flush those
# are all still to encode: more slices a frame, frame threads against the served slices, fewer or
# no B-frames.
X264_VARIANTS = (
    (16, "SLICE", "mbtree=0"),
    (8, "FRAME", "mbtree=0"),
    (8, "SLICE", "mbtree=0:bframes=1"),
    (8, "SLICE", "mbtree=0:bframes=0"),
)


def streamed_tail_ms(clip: np.ndarray) -> float:
    """ms from the last piece's arrival to the finished file, pieces spaced as the VAE sends them."""
    writer = Mp4Writer(fps=16)
    pieces = [clip[:1]] + [clip[start : start + 4] for start in range(1, len(clip), 4)]
    next_arrival_s = time.perf_counter()
    for piece in pieces:
        time.sleep(max(0.0, next_arrival_s - time.perf_counter()))
        last_arrival_s = max(next_arrival_s, time.perf_counter())
        writer.write(piece)
        next_arrival_s = last_arrival_s + PIECE_INTERVAL_S
    writer.finish()
    return 1000 * (time.perf_counter() - last_arrival_s)


class _PlayedRequest:
    """Plays a Wan request's end for `mux_video`: its pieces spaced as the VAE sends them, then Done;
    `last_piece_s` is the last one's perf_counter time, `metrics` takes the encode's observation."""

    params = {"fps": 16}

    def __init__(self, pieces: list[np.ndarray]):
        self.pieces = pieces
        self.last_piece_s = 0.0
        self.metrics = self

    def observe_media_encode(self, media_format: str, seconds: float) -> None:
        pass

    async def outputs(self, submitted, on_progress, on_piece):
        for piece in self.pieces:
            await asyncio.sleep(PIECE_INTERVAL_S)
            self.last_piece_s = time.perf_counter()
            await on_piece(piece)
        return {}


def api_path_tail_ms(clip: np.ndarray) -> float:
    """ms from the last piece's arrival to the MP4 through the API's mux_video."""
    from mstar.api.routes_videos import mux_video

    request = _PlayedRequest([clip[:1]] + [clip[start : start + 4] for start in range(1, len(clip), 4)])

    async def run() -> float:
        await mux_video(request, request)
        return 1000 * (time.perf_counter() - request.last_piece_s)

    return asyncio.run(run())


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


def noisy_clip() -> np.ndarray:
    """Like a random-weight model's decode: fine noise over every frame (x264 needs ~5 MB for it)."""
    rng = np.random.default_rng(1)
    base = rng.normal(128, 40, (480, 832, 3))
    frames = [np.roll(base, t, axis=1) + rng.normal(0, 40, base.shape) for t in range(33)]
    return np.stack(frames).clip(0, 255).astype(np.uint8)


def main() -> None:
    print(f"host cores: {os.cpu_count()}")
    if "--mp4-only" not in sys.argv:
        encode_pngs()
    if importlib.util.find_spec("av") is None:
        print("mp4: skipped (PyAV is not installed here)")
        return
    if "--thread-counts" in sys.argv:
        thread_counts(drifting_clip())
    for name, clip in (("drifting", drifting_clip()), ("noisy", noisy_clip())):
        x264_variants(name, clip)


def encode_pngs() -> None:
    for name, image in images().items():
        for encoder_name, encode in (("pillow level 1", pillow_png), ("mstar png", encode_png)):
            ms, size_bytes = median_ms(lambda e=encode, i=image: e(i))
            print(f"png {name} 1024x1024, {encoder_name}: {ms:.1f} ms, {size_bytes / 1e6:.2f} MB")


def thread_counts(clip: np.ndarray) -> None:
    served_threads = media.MP4_ENCODE_THREADS
    for threads in THREAD_COUNTS:
        media.MP4_ENCODE_THREADS = threads
        served = " (served)" if threads == served_threads else ""
        print(
            f"mp4 832x480x33 (veryfast, mbtree off), x264 threads {threads or 'auto'}{served}: {mp4_figures(clip)}"
        )
    media.MP4_ENCODE_THREADS = served_threads


def x264_variants(clip_name: str, clip: np.ndarray) -> None:
    served = (media.MP4_ENCODE_THREADS, media.MP4_THREAD_TYPE, media.MP4_X264_PARAMS)
    for variant in (served, *X264_VARIANTS):
        media.MP4_ENCODE_THREADS, media.MP4_THREAD_TYPE, media.MP4_X264_PARAMS = variant
        threads, thread_type, params = variant
        label = f"{threads} {thread_type.lower()} threads, {params}" + (
            " (served)" if variant == served else ""
        )
        print(f"mp4 {clip_name} 832x480x33 (veryfast), {label}: {mp4_figures(clip)}")
    media.MP4_ENCODE_THREADS, media.MP4_THREAD_TYPE, media.MP4_X264_PARAMS = served
    tail_ms = median([api_path_tail_ms(clip) for _ in range(3)])
    print(f"mp4 {clip_name}, served settings, streamed through the API's mux_video: tail {tail_ms:.0f} ms")


def mp4_figures(clip: np.ndarray) -> str:
    """The clip's encode whole and its streamed tail at media's current x264 settings."""
    ms, size_bytes = median_ms(lambda: encode_mp4(clip, fps=16), num_runs=3)
    tail_ms = median([streamed_tail_ms(clip) for _ in range(3)])
    return f"whole {ms:.0f} ms, streamed tail {tail_ms:.0f} ms, {size_bytes / 1e6:.2f} MB"


if __name__ == "__main__":
    main()
