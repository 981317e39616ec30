"""Our server's serving profile, right after /ready, in one client session:

1. cold: the first request after /ready, alone (its latency against the steady c=1 p50);
2. steady c=1: `num_steady` requests back to back (p50, per minute);
3. high concurrency: closed loop at `high_concurrency` (per minute, ratio to c=1);
4. new size: the first request at `new_size` (a size the server did not compile at warmup), alone;
   then, `new_size_settle_s` later (its compile runs off the serving path meanwhile), `num_steady`
   requests at that size: the first against their p50;
5. mixed: `sizes` interleaved at `high_concurrency` (p50, p99, p99/p50, recompiles in the run);
6. parity: request 0 again, sent together with `company_sizes` requests in flight; its output
   against request 0 run alone (steady). PNG images: PSNR of pixels. MP4 videos are lossy: equal
   bytes prove equal frames, otherwise the PSNR of the decoded frames is only indicative.
Request 0 of every phase repeats the cold request (prompt and seed: the parity checks compare
them); the other requests' prompts carry their phase's tag, so they are new to the server's prompt
cache, as a user's prompts would be. Recompiles are scraped from /metrics
(`mstar:recompiles_total`) after every phase; peak GPU memory is polled over the whole session. A
time guard skips (or shortens) phases that would not fit in `max_duration_s`, and `on_update`
receives the result after every phase, so a killed run keeps what it measured.
"""

from __future__ import annotations

import asyncio
import io
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from mstar.bench.gpu_memory import PeakMemoryPoller, metrics_allocated_reader
from mstar.bench.serve import RequestRecord, ServeOptions, closed_loop, record_dict, run_one, summarize
from mstar.bench.server_metrics import (
    node_breakdown,
    node_seconds_from_metrics,
    scrape_metrics,
    scrape_recompiles,
    stage_breakdown,
    stage_seconds_from_metrics,
)

COMPANY_FIRST_INDEX = 1000  # company requests: their own prompts' seeds, away from the measured ones


@dataclass
class SuiteOptions:
    serve: ServeOptions  # size = the steady size; sizes = the mixed run's sizes
    num_steady: int = 3
    high_concurrency: int = 4
    num_high: int = 4
    num_mixed: int = 8
    company_sizes: list[str] = field(default_factory=list)  # parity: requests in flight with request 0
    boot_s: float | None = None  # time to /ready, measured by the caller
    max_duration_s: float = 1e9
    new_size: str | None = None  # WxH not compiled at warmup: its first request against its steady
    new_size_settle_s: float = 60.0  # before the new size's steady requests: its compile's time


def decode_frames(media: bytes, kind: str) -> Any:
    """uint8 [F, H, W, 3] from PNG (lossless) or MP4 bytes."""
    import numpy as np

    if kind == "video":
        from mstar.api.media import decode_mp4

        return decode_mp4(media)
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(media)).convert("RGB"))[None]


def psnr_db(first: Any, second: Any) -> float:
    """PSNR of two uint8 arrays in dB; inf when identical."""
    import numpy as np

    if first.shape != second.shape:
        raise ValueError(f"shapes differ: {first.shape} vs {second.shape}")
    mse = float(np.mean((first.astype(np.float64) - second.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def compare_outputs(alone: RequestRecord, other: RequestRecord, kind: str) -> dict[str, Any]:
    """Same request (same seed), alone vs `other`: equal bytes, and PSNR where it can be computed."""
    entry: dict[str, Any] = {"identical_bytes": alone.media_sha256 == other.media_sha256, "psnr_db": None}
    entry["source"] = "png pixels" if kind == "image" else "decoded mp4 (lossy: indicative only)"
    if entry["identical_bytes"] and alone.media_sha256 is not None:
        entry["psnr_db"] = math.inf  # same PNG/MP4 bytes: same frames
    elif alone.media is not None and other.media is not None:
        try:
            entry["psnr_db"] = psnr_db(decode_frames(alone.media, kind), decode_frames(other.media, kind))
        except Exception as error:  # e.g. PyAV missing: bytes compared only
            entry["note"] = f"not decoded: {type(error).__name__}: {error}"
    return entry


def phase_entry(records: list[RequestRecord], kind: str, concurrency: int) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        **summarize(records, kind),
        "requests": [record_dict(r) for r in records],
    }


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


class _Session:
    """One suite run: the client, the clock, the result so far and its recompile scrapes."""

    def __init__(self, options: SuiteOptions, client: Any, on_update: Callable[[dict], None]):
        self.options, self.client, self.on_update = options, client, on_update
        self.kind = options.serve.kind
        self.start_s = time.perf_counter()
        self.per_request_s: float | None = None  # the steady c=1 latency: the time guard's estimate
        self.mixed_zero: RequestRecord | None = None  # request 0 of the mixed run (it had company)
        self.result: dict[str, Any] = {"phases": {}, "skipped": [], "recompiles": {}}
        self.memory: PeakMemoryPoller | None = None  # set while the phases run: device-wide (NVML)
        self.allocated: PeakMemoryPoller | None = None  # what the server's tensors held (torch)

    def remaining_s(self) -> float:
        return self.options.max_duration_s - (time.perf_counter() - self.start_s)

    def fitting(self, name: str, num_requests: int, concurrency: int, min_requests: int) -> int:
        """How many of `num_requests` fit the time left (0: the phase is skipped, and says so)."""
        if num_requests <= 0:
            return 0
        cost_s = self.per_request_s or 0.0
        # a wave of `concurrency` costs about `concurrency` requests alone (batching is the bonus)
        fit = num_requests if cost_s == 0 else int(self.remaining_s() / cost_s)
        fit = min(num_requests, fit - fit % concurrency if fit >= concurrency else fit)
        if fit < min_requests:
            self.result["skipped"].append(
                f"{name}: {self.remaining_s():.0f} s left, about {cost_s:.1f} s/request"
            )
            return 0
        if fit < num_requests:
            self.result["skipped"].append(
                f"{name}: shortened to {fit} of {num_requests} requests (time guard)"
            )
        return fit

    async def scrape(self, label: str) -> int | None:
        count = await scrape_recompiles(self.client)
        self.result["recompiles"][label] = count
        return count

    async def closed(self, name: str, options: ServeOptions, concurrency: int) -> list[RequestRecord]:
        text_before = await scrape_metrics(self.client) or ""
        for poller in (self.memory, self.allocated):
            if poller is not None:
                poller.start_window()
        records = await closed_loop(self.client, options, concurrency, first_index=0)
        self.result["phases"][name] = phase_entry(records, self.kind, concurrency)
        if self.memory is not None:  # device-wide (NVML): includes what the server's allocator keeps
            self.result["phases"][name]["peak_gpu_memory_gib"] = self.memory.window_peak_gib
        if self.allocated is not None:  # like diffusers' figure (torch.cuda.max_memory_allocated)
            self.result["phases"][name]["peak_gpu_allocated_gib"] = self.allocated.window_peak_gib
        text_after = await scrape_metrics(self.client) or ""
        self.result["phases"][name]["nodes"] = node_breakdown(
            node_seconds_from_metrics(text_before), node_seconds_from_metrics(text_after), len(records)
        )
        # where a request's time went on the server: its walks, e2e, the API's encode (ms each)
        self.result["phases"][name]["server_ms_per_request"] = stage_breakdown(
            stage_seconds_from_metrics(text_before), stage_seconds_from_metrics(text_after), len(records)
        )
        await self.scrape(f"after_{name}")
        self.on_update(self.result)
        return records


async def _company_run(session: _Session, options: ServeOptions) -> tuple[RequestRecord, list[RequestRecord]]:
    """Request 0 (the steady size) while requests of `company_sizes` are in flight."""
    company = replace(options, sizes=tuple(session.options.company_sizes), prompt_tag="company")
    sends = [run_one(session.client, company, COMPANY_FIRST_INDEX + i) for i in range(len(company.sizes))]
    target, *others = await asyncio.gather(run_one(session.client, options, 0), *sends)
    return target, others


def _overlapping(target: RequestRecord, others: list[RequestRecord]) -> int:
    return sum(1 for o in others if o.start_s < target.end_s and o.end_s > target.start_s)


async def _parity(
    session: _Session, options: ServeOptions, cold: RequestRecord, alone: RequestRecord
) -> None:
    parity: dict[str, Any] = {"repeat_alone": compare_outputs(alone, cold, session.kind)}
    mixed = session.result["phases"].get("mixed")
    if mixed is not None and session.mixed_zero is not None and session.mixed_zero.size == alone.size:
        parity["mixed_c" + str(mixed["concurrency"])] = compare_outputs(
            alone, session.mixed_zero, session.kind
        )
    if session.options.company_sizes and session.fitting("parity", 1, 1, 1):
        target, others = await _company_run(session, options)
        entry = compare_outputs(alone, target, session.kind) if target.ok else {"error": target.error}
        entry |= {
            "company_sizes": session.options.company_sizes,
            "company_overlapping": _overlapping(target, others),
        }
        parity["with_company"] = entry
        await session.scrape("after_parity")
    session.result["parity"] = parity


async def _phases(session: _Session) -> None:
    suite, result = session.options, session.result
    steady = replace(suite.serve, sizes=(), keep_media=True)
    await session.scrape("at_ready")
    cold = await run_one(session.client, steady, 0)  # the first request after /ready
    result["cold"] = record_dict(cold)
    await session.scrape("after_cold")
    session.on_update(result)
    session.per_request_s = cold.latency_s
    alone = None
    if num := session.fitting("steady_c1", suite.num_steady, 1, 1):
        records = await session.closed("steady_c1", replace(steady, num_requests=num, prompt_tag="c1"), 1)
        alone = records[0] if records[0].ok else None
        session.per_request_s = result["phases"]["steady_c1"]["latency_p50_s"] or session.per_request_s
    high = suite.high_concurrency
    if num := session.fitting(f"c{high}", suite.num_high, high, high):
        await session.closed(f"c{high}", replace(steady, num_requests=num, prompt_tag=f"c{high}"), high)
    if suite.new_size and session.fitting("new_size", 2 + suite.num_steady, 1, 2):
        await _new_size(session, replace(steady, size=suite.new_size, keep_media=False))
    if num := session.fitting("mixed", suite.num_mixed, high, min(high, suite.num_mixed)):
        sizes = tuple(suite.serve.sizes or [suite.serve.size])
        mixed = replace(steady, sizes=sizes, num_requests=num, prompt_tag="mixed")
        records = await session.closed("mixed", mixed, high)
        session.mixed_zero = records[0] if records[0].ok and len(records) > 1 else None
    if alone is not None and cold.ok:
        await _parity(session, steady, cold, alone)
    await asyncio.sleep(0.5)  # a worker's recompile report reaches /metrics a beat after the step
    await session.scrape("at_end")


async def _new_size(session: _Session, options: ServeOptions) -> None:
    """A size the warmup did not compile: its first request (served while that size compiles in
    the background), then its steady c=1 once the compile had `new_size_settle_s` to finish."""
    first = await run_one(session.client, replace(options, prompt_tag="new-size"), 0)
    session.result["new_size_first"] = record_dict(first)
    await session.scrape("after_new_size_first")
    session.on_update(session.result)
    settle_s = min(session.options.new_size_settle_s, max(0.0, session.remaining_s() - 60.0))
    await asyncio.sleep(settle_s)
    num = max(1, session.options.num_steady)
    await session.closed("new_size_c1", replace(options, num_requests=num, prompt_tag="new-size-c1"), 1)


def summary(result: dict[str, Any], kind: str, high_concurrency: int) -> dict[str, Any]:
    """The headline figures from the phases measured."""
    unit = "images_per_minute" if kind == "image" else "videos_per_minute"
    phases, recompiles = result["phases"], result["recompiles"]
    steady, high, mixed = (phases.get(n) or {} for n in ("steady_c1", f"c{high_concurrency}", "mixed"))
    cold_s = result.get("cold", {}).get("latency_s") if result.get("cold", {}).get("ok") else None
    first, last = recompiles.get("at_ready"), recompiles.get("at_end")
    new_first = result.get("new_size_first") or {}
    new_first_s = new_first.get("latency_s") if new_first.get("ok") else None
    new_steady_s = (phases.get("new_size_c1") or {}).get("latency_p50_s")
    # the last scrape before the mixed run (a fresh server's mixed run follows the cold request)
    before_mixed = ("after_new_size_c1", f"after_c{high_concurrency}", "after_steady_c1", "after_cold")
    mixed_before = next((recompiles[k] for k in before_mixed if recompiles.get(k) is not None), None)
    return {
        "boot_s": result.get("boot_s"),
        "cold_latency_s": cold_s,
        "steady_p50_s": steady.get("latency_p50_s"),
        "cold_over_steady": _ratio(cold_s, steady.get("latency_p50_s")),
        "new_size_first_s": new_first_s,
        "new_size_steady_p50_s": new_steady_s,
        "new_size_first_over_steady": _ratio(new_first_s, new_steady_s),
        "per_minute_c1": steady.get(unit),
        f"per_minute_c{high_concurrency}": high.get(unit),
        "throughput_ratio": _ratio(high.get(unit), steady.get(unit)),
        "mixed_p50_s": mixed.get("latency_p50_s"),
        "mixed_p99_s": mixed.get("latency_p99_s"),
        "mixed_p99_over_p50": _ratio(mixed.get("latency_p99_s"), mixed.get("latency_p50_s")),
        "recompiles_in_mixed": None
        if None in (mixed_before, recompiles.get("after_mixed"))
        else recompiles["after_mixed"] - mixed_before,
        "recompiles_in_traffic": None if None in (first, last) else last - first,
        "peak_gpu_memory_gib": result.get("peak_gpu_memory_gib"),
        "peak_gpu_memory_c1_gib": steady.get("peak_gpu_memory_gib"),
        "peak_gpu_allocated_gib": result.get("peak_gpu_allocated_gib"),
        "peak_gpu_allocated_c1_gib": steady.get("peak_gpu_allocated_gib"),
    }


async def _run(options: SuiteOptions, on_update: Callable[[dict], None]) -> dict[str, Any]:
    import httpx

    serve = options.serve
    max_in_flight = max(options.high_concurrency, len(options.company_sizes) + 1, 1) + 4
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    headers = {"Authorization": f"Bearer {serve.api_key}"} if serve.api_key else {}
    timeout = httpx.Timeout(serve.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(
        base_url=serve.base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        session = _Session(options, client, lambda _: None)
        session.result["boot_s"] = options.boot_s

        def update(result: dict[str, Any]) -> None:
            result["peak_gpu_memory_gib"], result["gpu_memory_source"] = memory.peak_gib, memory.source
            result["peak_gpu_allocated_gib"] = allocated.peak_gib
            result["summary"] = summary(result, serve.kind, options.high_concurrency)
            on_update(result)

        session.on_update = update
        allocated_reader = metrics_allocated_reader(serve.base_url)
        with PeakMemoryPoller() as memory, PeakMemoryPoller(reader=allocated_reader) as allocated:
            session.memory, session.allocated = memory, allocated
            await _phases(session)
        update(session.result)
        return session.result


def run_serve_suite(options: SuiteOptions, on_update: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """The JSON-able result: {"benchmark": "serve-suite", "summary", "phases", "parity", ...}."""
    head = {
        "benchmark": "serve-suite",
        "title": f"serving profile of {options.serve.model or options.serve.base_url}",
        "options": asdict(options) | {"serve": asdict(options.serve) | {"api_key": None}},
    }

    def publish(result: dict[str, Any]) -> None:
        if on_update is not None:
            on_update(head | result)

    return head | asyncio.run(_run(options, publish))
