"""Serving benchmark: any server with the OpenAI image and video routes (ours, SGLang-Diffusion, vLLM-Omni).

Closed loop: `concurrency` clients each send their next request when the previous one ends.
Open loop: requests arrive as a seeded Poisson process at `request_rate` per second, whatever the
server's backlog. Warmup requests run first and are left out of every figure.
Images: POST /v1/images/generations. Videos: POST /v1/videos, poll GET /v1/videos/{id} until it
ends (time to first progress = first poll with progress > 0), then GET /v1/videos/{id}/content.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from mstar.bench.gpu_memory import PeakMemoryPoller
from mstar.bench.stats import percentile
from mstar.client.client import poll_wait_s

WARMUP_FIRST_INDEX = 1_000_000

DEFAULT_PROMPTS = (
    "a red fox running through fresh snow at dawn",
    "a lighthouse on a rocky coast during a storm, waves crashing",
    "a bowl of ramen on a wooden table, steam rising, close-up",
    "a city street at night in the rain, neon reflections",
    "a hot air balloon drifting over green hills",
    "an astronaut reading a book on the moon",
    "a koi pond seen from above, autumn leaves on the water",
    "a vintage train crossing a stone bridge in the mountains",
)


@dataclass
class ServeOptions:
    base_url: str
    kind: str = "image"  # "image" | "video"
    model: str | None = None
    size: str | None = None  # "WxH"
    seconds: str | None = None  # videos: the OpenAI `seconds` field
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    seed: int = 0
    num_requests: int = 16
    num_warmup: int = 2
    request_timeout_s: float = 600.0
    poll_interval_s: float = 0.25
    api_key: str | None = None
    video_form: bool = False  # send POST /v1/videos as multipart form fields instead of JSON
    sizes: tuple[str, ...] = ()  # mixed sizes: request i asks for sizes[i % len]; empty: `size`
    keep_media: bool = False  # keep each output's bytes on its record (parity checks)
    # Requests past index 0 get "(<tag> <index>)" after their prompt, so a run's prompts are new to
    # a server that caches prompt embeddings (the serving suite tags each phase); None: as listed.
    prompt_tag: str | None = None


@dataclass
class RequestRecord:
    index: int
    start_s: float
    end_s: float = 0.0
    ok: bool = False
    error: str | None = None  # "http_429", "timeout", "connection", "job_failed", ...
    first_progress_s: float | None = None  # seconds from send to first progress > 0
    ended_seen_s: float | None = None  # videos: seconds from send to the poll that saw the job end
    output_bytes: int = 0
    size: str | None = None
    media_sha256: str | None = None  # of the image (decoded from base64) or the MP4
    media = None  # not a dataclass field (never in JSON): the output bytes when options.keep_media

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


class RequestError(Exception):
    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def request_size(options: ServeOptions, index: int) -> str | None:
    return options.sizes[index % len(options.sizes)] if options.sizes else options.size


def request_body(options: ServeOptions, index: int) -> dict[str, Any]:
    """The fixed workload: prompt and seed depend only on the request index (and the tag)."""
    prompt = options.prompts[index % len(options.prompts)]
    if options.prompt_tag is not None and index > 0:
        prompt = f"{prompt} ({options.prompt_tag} {index})"
    body: dict[str, Any] = {"prompt": prompt, "seed": options.seed + index}
    optional = {
        "model": options.model,
        "size": request_size(options, index),
        "num_inference_steps": options.num_inference_steps,
        "guidance_scale": options.guidance_scale,
    }
    if options.kind == "image":
        body.update(n=1, response_format="b64_json")
    else:
        optional["seconds"] = options.seconds
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(options.extra_body)
    return body


def _check(response: Any) -> None:
    if response.status_code >= 400:
        raise RequestError(f"http_{response.status_code}")


def _hash_media(record: RequestRecord, keep_media: bool) -> None:
    """After the clock stops: hashing is the benchmark's (for parity), not a user's cost."""
    if record.media is not None:
        record.media_sha256 = hashlib.sha256(record.media).hexdigest()
        if not keep_media:
            record.media = None


async def _send_image(client: Any, options: ServeOptions, record: RequestRecord) -> None:
    response = await client.post("/v1/images/generations", json=request_body(options, record.index))
    _check(response)
    record.output_bytes = len(response.content)
    data = response.json().get("data") or [{}]
    if data[0].get("b64_json"):
        record.media = base64.b64decode(data[0]["b64_json"])  # the image as a user gets it


async def _send_video(client: Any, options: ServeOptions, record: RequestRecord) -> None:
    body = request_body(options, record.index)
    if options.video_form:
        form = {k: str(v) for k, v in body.items()}
        response = await client.post("/v1/videos", data=form)
    else:
        response = await client.post("/v1/videos", json=body)
    _check(response)
    job = response.json()
    video_id = job["id"]
    while job.get("status") not in ("completed", "failed", "cancelled"):
        # 0: the server's hint at each poll, as mstar.client waits
        await asyncio.sleep(poll_wait_s(options.poll_interval_s or None, response.headers))
        response = await client.get(f"/v1/videos/{video_id}")
        _check(response)
        job = response.json()
        if record.first_progress_s is None and (job.get("progress") or 0) > 0:
            record.first_progress_s = time.perf_counter() - record.start_s
    record.ended_seen_s = time.perf_counter() - record.start_s  # the rest is the download
    if job["status"] != "completed":
        raise RequestError("job_failed" if job["status"] == "failed" else "job_cancelled")
    response = await client.get(f"/v1/videos/{video_id}/content")
    _check(response)
    record.output_bytes = len(response.content)
    record.media = response.content


def _error_kind(error: BaseException) -> str:
    import httpx

    if isinstance(error, RequestError):
        return error.kind
    if isinstance(error, asyncio.TimeoutError | httpx.TimeoutException):
        return "timeout"
    if isinstance(error, httpx.TransportError):  # connect/read/write errors, a dropped connection
        return "connection"
    if isinstance(error, ValueError | KeyError):  # a body that is not the expected JSON
        return "bad_response"
    return type(error).__name__


async def run_one(client: Any, options: ServeOptions, index: int) -> RequestRecord:
    record = RequestRecord(index=index, start_s=time.perf_counter(), size=request_size(options, index))
    send = _send_image if options.kind == "image" else _send_video
    try:
        await asyncio.wait_for(send(client, options, record), timeout=options.request_timeout_s)
        record.ok = True
    except Exception as error:  # every failure is counted by kind, never raised
        record.error = _error_kind(error)
    record.end_s = time.perf_counter()
    _hash_media(record, options.keep_media)
    return record


async def closed_loop(
    client: Any, options: ServeOptions, concurrency: int, first_index: int
) -> list[RequestRecord]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(first_index, first_index + options.num_requests):
        queue.put_nowait(index)
    records: list[RequestRecord] = []

    async def client_loop() -> None:
        while not queue.empty():
            records.append(await run_one(client, options, queue.get_nowait()))

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return sorted(records, key=lambda r: r.index)


def poisson_arrivals_s(num_requests: int, request_rate: float, seed: int) -> list[float]:
    """Send times (s from the start) of a Poisson process; the same seed gives the same schedule."""
    rng = random.Random(seed)
    clock_s, arrivals = 0.0, []
    for _ in range(num_requests):
        clock_s += rng.expovariate(request_rate)
        arrivals.append(clock_s)
    return arrivals


async def open_loop(
    client: Any, options: ServeOptions, request_rate: float, first_index: int
) -> list[RequestRecord]:
    start = time.perf_counter()

    async def send_at(index: int, at_s: float) -> RequestRecord:
        await asyncio.sleep(max(0.0, start + at_s - time.perf_counter()))
        return await run_one(client, options, index)

    arrivals = poisson_arrivals_s(options.num_requests, request_rate, options.seed)
    tasks = [send_at(first_index + i, at_s) for i, at_s in enumerate(arrivals)]
    return list(await asyncio.gather(*tasks))


def summarize(records: list[RequestRecord], kind: str) -> dict[str, Any]:
    """Latency percentiles over successes, throughput over the measured window, errors by kind."""
    done = [r for r in records if r.ok]
    latencies = [r.latency_s for r in done]
    first_progress = [r.first_progress_s for r in done if r.first_progress_s is not None]
    window_s = (max(r.end_s for r in records) - min(r.start_s for r in records)) if records else 0.0
    errors: dict[str, int] = {}
    for record in records:
        if record.error is not None:
            errors[record.error] = errors.get(record.error, 0) + 1
    unit = "images" if kind == "image" else "videos"
    return {
        "num_requests": len(records),
        "num_completed": len(done),
        "num_failed": len(records) - len(done),
        "errors": errors,
        "latency_p50_s": percentile(latencies, 50),
        "latency_p95_s": percentile(latencies, 95),
        "latency_p99_s": percentile(latencies, 99),
        "latency_mean_s": sum(latencies) / len(latencies) if latencies else None,
        "first_progress_p50_s": percentile(first_progress, 50),
        "first_progress_p95_s": percentile(first_progress, 95),
        "window_s": window_s,
        f"{unit}_per_minute": 60.0 * len(done) / window_s if window_s > 0 else 0.0,
    }


async def _run_all(options: ServeOptions, concurrencies: list[int], request_rates: list[float]) -> list[dict]:
    import httpx

    max_in_flight = max([*concurrencies, options.num_requests if request_rates else 1, options.num_warmup, 1])
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
    limits = httpx.Limits(max_connections=max_in_flight + 4, max_keepalive_connections=max_in_flight + 4)
    timeout = httpx.Timeout(options.request_timeout_s, connect=10.0)
    runs: list[dict] = []
    async with httpx.AsyncClient(
        base_url=options.base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        # Warmup indices lie past the measured ones: their own prompts' seeds, never negative.
        warmup = [await run_one(client, options, WARMUP_FIRST_INDEX + i) for i in range(options.num_warmup)]
        runs.append({"mode": "warmup", **summarize(warmup, options.kind)})
        # Every measured run replays the same prompts and seeds (indices 0..num_requests-1).
        for concurrency in concurrencies:
            with PeakMemoryPoller() as memory:
                records = await closed_loop(client, options, concurrency, first_index=0)
            runs.append(_run_entry("closed", concurrency, None, records, options.kind, memory))
        for rate in request_rates:
            with PeakMemoryPoller() as memory:
                records = await open_loop(client, options, rate, first_index=0)
            runs.append(_run_entry("open", None, rate, records, options.kind, memory))
    return runs


def _run_entry(mode: str, concurrency, rate, records, kind: str, memory: PeakMemoryPoller) -> dict[str, Any]:
    return {
        "mode": mode,
        "concurrency": concurrency,
        "request_rate": rate,
        **summarize(records, kind),
        "peak_gpu_memory_gib": memory.peak_gib,
        "gpu_memory_source": memory.source,
        "requests": [record_dict(r) for r in records],
    }


def record_dict(record: RequestRecord) -> dict[str, Any]:
    return asdict(record) | {"latency_s": record.latency_s}


def run_serve_benchmark(
    options: ServeOptions, concurrencies: list[int], request_rates: list[float] | None = None
) -> dict[str, Any]:
    """Runs warmup, then each concurrency (closed loop), then each rate (open loop); a JSON-able result."""
    request_rates = request_rates or []
    runs = asyncio.run(_run_all(options, concurrencies, request_rates))
    public = asdict(options) | {"api_key": "***" if options.api_key else None}
    title = f"{options.kind}s from {options.base_url}" + (
        f" (model {options.model})" if options.model else ""
    )
    return {"benchmark": "serve", "title": title, "options": public, "runs": runs}
