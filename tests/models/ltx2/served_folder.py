"""A diffusers folder served the way a user serves one: `mstar serve MODEL --model-path FOLDER` in
its own process (port 0, the announced URL read from its stdout, its stderr kept in a log file),
one POST /v1/videos over HTTP polled to the end, and the checks of the MP4 that comes back: H.264
frames of the asked size and count, an AAC track at the vocoder's rate as long as the video (within
one AAC frame), the job's audio entry. The CPU test runs it on a tiny folder, the GPU test on a
real-size one, both written by the parity hook's save_pretrained."""

from __future__ import annotations

import io
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
AAC_FRAME = 1024  # samples in one AAC frame: the muxed track is as long as the video within one
SERVING = "mstar: serving"
STOP_TIMEOUT_S = 60.0
POLL_S = 0.1


@contextmanager
def serve_folder(
    model: str, folder: Path, log_path: Path, *flags: str, boot_timeout_s: float
) -> Iterator[str]:
    """The base URL of `mstar serve MODEL --model-path FOLDER --port 0 FLAGS...` once it serves."""
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path)
    env.pop("MSTAR_API_KEY", None)
    command = [sys.executable, "-m", "mstar.cli", "serve", model, "--model-path", str(folder), "--port", "0"]
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [*command, *flags], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True
        )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(process.stdout, lines), daemon=True).start()
    try:
        yield _announced_url(lines, boot_timeout_s, log_path)
    finally:
        _stop(process)


def _forward_lines(stream: Any, lines: queue.Queue) -> None:
    for line in stream:  # drained to the end, so the server never blocks on a full pipe
        lines.put(line)
    lines.put(None)


def _announced_url(lines: queue.Queue, timeout_s: float, log_path: Path) -> str:
    deadline = time.monotonic() + timeout_s
    while (left_s := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left_s)
        except queue.Empty:
            break
        if line is None:
            raise AssertionError(f"the server exited during boot; its log ends:\n{_tail(log_path)}")
        if SERVING in line:
            return line.split(" on ")[1].split()[0]
    raise AssertionError(f"no '{SERVING}' within {timeout_s:.0f} s; the log ends:\n{_tail(log_path)}")


def _tail(log_path: Path, num_lines: int = 30) -> str:
    text = log_path.read_text(errors="replace").replace("\r", "\n")
    return "\n".join(text.splitlines()[-num_lines:])


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGINT)  # a clean stop: the server ends its workers
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)


def generate_video(base_url: str, body: dict[str, Any], timeout_s: float) -> tuple[dict, bytes]:
    """(the finished job, the MP4) of one POST /v1/videos."""
    import httpx

    with httpx.Client(base_url=base_url, timeout=60.0) as client:
        response = client.post("/v1/videos", json=body)
        assert response.status_code == 200, response.text
        job = response.json()
        deadline = time.monotonic() + timeout_s
        while job["status"] not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
            time.sleep(POLL_S)
            job = client.get(f"/v1/videos/{job['id']}").json()
        assert job["status"] == "completed", job
        content = client.get(f"/v1/videos/{job['id']}/content")
        assert content.status_code == 200, content.text
        return job, content.content


def check_soundtrack(
    job: dict, mp4: bytes, body: dict[str, Any], sample_rate: int, num_channels: int
) -> None:
    """The MP4 of `body` (size, num_frames, fps): H.264 frames, AAC audio as long as the video."""
    import av

    from mstar.api.media import decode_mp4, decode_mp4_audio

    width, height = (int(side) for side in body["size"].split("x"))
    seconds = body["num_frames"] / body["fps"]
    assert job["audio"]["sample_rate"] == sample_rate and job["audio"]["codec"] == "aac"
    assert abs(job["audio"]["seconds"] - seconds) <= 1 / sample_rate
    with av.open(io.BytesIO(mp4)) as container:
        (video_stream,), (audio_stream,) = container.streams.video, container.streams.audio
        assert video_stream.codec_context.name == "h264" and audio_stream.codec_context.name == "aac"
    frames = decode_mp4(mp4)
    assert frames.shape == (body["num_frames"], height, width, 3) and frames.std() > 0
    waveform, rate = decode_mp4_audio(mp4)
    assert rate == sample_rate and waveform.shape[0] == num_channels
    assert abs(waveform.shape[1] - seconds * sample_rate) <= AAC_FRAME, waveform.shape
    assert waveform.std() > 0
