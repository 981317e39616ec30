"""A fake OpenAI-shaped media server for the serve-benchmark tests: controlled delays and failures.

The behaviour of a request is set by its seed (the benchmark sends seed + index):
- images: delay `image_delay_s`; a seed in `fail_seeds` answers HTTP 500; in `slow_seeds` sleeps 1.5 s.
- videos: a job completes `video_duration_s` after creation, progress rising linearly after
  `video_queue_s`; a seed in `fail_seeds` ends as status "failed".
The server counts every request it received and the most it ever had in flight.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response


@dataclass
class FakeBehaviour:
    image_delay_s: float = 0.05
    video_queue_s: float = 0.05
    video_duration_s: float = 0.3
    fail_seeds: set[int] = field(default_factory=set)
    slow_seeds: set[int] = field(default_factory=set)


@dataclass
class FakeCounters:
    num_image_requests: int = 0
    num_video_jobs: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    seeds: list[int] = field(default_factory=list)


def build_app(behaviour: FakeBehaviour, counters: FakeCounters) -> FastAPI:
    app = FastAPI()
    jobs: dict[str, dict] = {}

    @app.post("/v1/images/generations")
    async def images(request: Request) -> dict:
        body = await request.json()
        counters.num_image_requests += 1
        counters.seeds.append(body["seed"])
        counters.in_flight += 1
        counters.max_in_flight = max(counters.max_in_flight, counters.in_flight)
        try:
            delay_s = 1.5 if body["seed"] in behaviour.slow_seeds else behaviour.image_delay_s
            await asyncio.sleep(delay_s)
        finally:
            counters.in_flight -= 1
        if body["seed"] in behaviour.fail_seeds:
            raise HTTPException(status_code=500, detail="boom")
        return {"created": int(time.time()), "data": [{"b64_json": base64.b64encode(b"png" * 10).decode()}]}

    @app.post("/v1/videos")
    async def create_video(request: Request) -> dict:
        body = await request.json()
        counters.num_video_jobs += 1
        counters.seeds.append(body["seed"])
        video_id = f"video_{uuid.uuid4().hex}"
        jobs[video_id] = {"created_s": time.perf_counter(), "fails": body["seed"] in behaviour.fail_seeds}
        return _job_view(video_id, jobs[video_id], behaviour)

    @app.get("/v1/videos/{video_id}")
    async def get_video(video_id: str) -> dict:
        if video_id not in jobs:
            raise HTTPException(status_code=404, detail="no such video")
        return _job_view(video_id, jobs[video_id], behaviour)

    @app.get("/v1/videos/{video_id}/content")
    async def content(video_id: str) -> Response:
        return Response(content=b"\x00mp4" * 100, media_type="video/mp4")

    return app


def _job_view(video_id: str, job: dict, behaviour: FakeBehaviour) -> dict:
    elapsed_s = time.perf_counter() - job["created_s"]
    if elapsed_s >= behaviour.video_duration_s:
        status, progress = ("failed", 50) if job["fails"] else ("completed", 100)
    elif elapsed_s < behaviour.video_queue_s:
        status, progress = "queued", 0
    else:
        status = "in_progress"
        progress = int(100 * (elapsed_s - behaviour.video_queue_s) / behaviour.video_duration_s)
    return {"id": video_id, "object": "video", "status": status, "progress": progress}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class FakeServer:
    """uvicorn in a thread on a free port; `with FakeServer(behaviour) as server: server.url`."""

    def __init__(self, behaviour: FakeBehaviour | None = None):
        self.behaviour = behaviour or FakeBehaviour()
        self.counters = FakeCounters()
        self.port = free_port()
        config = uvicorn.Config(
            build_app(self.behaviour, self.counters), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
