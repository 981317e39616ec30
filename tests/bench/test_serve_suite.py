"""Our server's serving profile (`mstar bench serve-suite`): unit checks of the scrape, PSNR and summary,
then the whole suite against OUR server (the real API app and Runtime) serving tiny-digits."""

from __future__ import annotations

import asyncio
import io
import json
import math

import numpy as np
import pytest

from mstar.bench.serve import RequestRecord, ServeOptions
from mstar.bench.serve_suite import SuiteOptions, compare_outputs, psnr_db, run_serve_suite, summary
from mstar.bench.server_metrics import (
    node_breakdown,
    node_seconds_from_metrics,
    recompiles_from_metrics,
    scrape_recompiles,
    stage_breakdown,
    stage_seconds_from_metrics,
)
from mstar.bench.suite_report import suite_table

live = pytest.importorskip("tests.api.live")


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _record(index: int, media: bytes) -> RequestRecord:
    import hashlib

    record = RequestRecord(index=index, start_s=0.0, ok=True, media_sha256=hashlib.sha256(media).hexdigest())
    record.media = media
    return record


def test_recompiles_are_summed_from_our_metrics_text():
    from mstar.api.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    assert recompiles_from_metrics(metrics.render().decode()) == 0  # no sample before the first recompile
    metrics.count_recompile("dit", 2)
    metrics.count_recompile("vae_decoder", 1)
    text = metrics.render().decode()
    assert "mstar:recompiles_created" in text  # a sibling series that must not be counted
    assert recompiles_from_metrics(text) == 3


def test_node_breakdown_reads_step_durations_from_our_metrics_text():
    from mstar.api.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    metrics.observe_step("dit", 1, 100, 0.1)
    before = node_seconds_from_metrics(metrics.render().decode())
    for _ in range(4):
        metrics.observe_step("dit", 1, 100, 0.1)
    metrics.observe_step("vae_decoder", 1, 1, 0.05, host_duration_s=0.04)
    metrics.observe_step("vae_decoder", 1, 1, 0.07, host_duration_s=0.06)
    breakdown = node_breakdown(before, node_seconds_from_metrics(metrics.render().decode()), num_requests=2)
    assert breakdown["dit"]["ms_per_step"] == pytest.approx(100.0)
    assert breakdown["dit"]["host_ms_per_step"] == pytest.approx(0.0)
    assert breakdown["vae_decoder"]["host_ms_per_step"] == pytest.approx(50.0)
    assert breakdown["dit"]["ms_per_request"] == pytest.approx(200.0)
    assert breakdown["dit"]["steps_per_request"] == pytest.approx(2.0)
    assert breakdown["vae_decoder"]["ms_per_request"] == pytest.approx(60.0)


def test_stage_breakdown_reads_walks_e2e_and_encode_from_our_metrics_text():
    from mstar.api.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("m")
    metrics.observe_walk("encode_text", 0.5)  # before the phase: left out
    before = stage_seconds_from_metrics(metrics.render().decode())
    for _ in range(2):
        metrics.observe_walk("encode_text", 0.02)
        metrics.observe_walk("t2v", 6.0)
        metrics.observe_request_end("completed", 6.1)
        metrics.observe_media_encode("mp4", 0.05)
        metrics.observe_media_ready("mp4", 6.2)
    breakdown = stage_breakdown(before, stage_seconds_from_metrics(metrics.render().decode()), num_requests=2)
    assert breakdown == pytest.approx(
        {"walk:encode_text": 20.0, "walk:t2v": 6000.0, "e2e": 6100.0, "encode": 50.0, "ready": 6200.0}
    )


def test_psnr_and_output_comparison():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    assert psnr_db(image, image.copy()) == math.inf
    noisy = image.astype(np.int16)
    noisy[0, 0, 0] = (noisy[0, 0, 0] + 16) % 256  # one value off by 16 (or 240 when it wraps)
    mse = float((noisy[0, 0, 0] - int(image[0, 0, 0])) ** 2) / image.size
    assert psnr_db(image, noisy.astype(np.uint8)) == pytest.approx(10 * math.log10(255**2 / mse))
    same = compare_outputs(_record(0, _png(image)), _record(0, _png(image)), "image")
    assert same["identical_bytes"] and same["psnr_db"] == math.inf
    differs = compare_outputs(_record(0, _png(image)), _record(0, _png(noisy.astype(np.uint8))), "image")
    assert not differs["identical_bytes"]
    assert differs["psnr_db"] == pytest.approx(10 * math.log10(255**2 / mse))
    assert differs["source"] == "png pixels"


def test_summary_ratios_and_recompile_deltas():
    result = {
        "cold": {"ok": True, "latency_s": 11.0},
        "phases": {
            "steady_c1": {"latency_p50_s": 10.0, "videos_per_minute": 6.0},
            "c4": {"videos_per_minute": 9.0},
            "mixed": {"latency_p50_s": 20.0, "latency_p99_s": 30.0},
        },
        "recompiles": {"at_ready": 1, "after_c4": 2, "after_mixed": 5, "at_end": 5},
        "boot_s": 100.0,
    }
    s = summary(result, "video", 4)
    assert s["cold_over_steady"] == pytest.approx(1.1)
    assert s["throughput_ratio"] == pytest.approx(1.5)
    assert s["mixed_p99_over_p50"] == pytest.approx(1.5)
    assert (s["recompiles_in_mixed"], s["recompiles_in_traffic"]) == (3, 4)
    # a fresh server whose only traffic before the mixed run is the cold request
    fresh = {**result, "phases": {"mixed": result["phases"]["mixed"]}}
    fresh["recompiles"] = {"at_ready": 0, "after_cold": 1, "after_mixed": 1, "at_end": 1}
    assert (
        summary(fresh, "video", 4)["recompiles_in_mixed"],
        summary(fresh, "video", 4)["recompiles_in_traffic"],
    ) == (0, 1)


def _tiny_server(metrics):
    from mstar.api.app import create_app
    from mstar.config import ServerConfig
    from mstar.models.tiny_digits.model import TinyDigitsSpec

    spec = TinyDigitsSpec()
    return live.LiveServer(
        create_app(ServerConfig(model=spec.name, warmup=False), spec, metrics=metrics)
    ), spec


def test_recompile_scrape_through_our_metrics_route():
    import httpx

    from mstar.api.metrics import PrometheusMetrics

    metrics = PrometheusMetrics("tiny-digits")
    server, _ = _tiny_server(metrics)

    async def scrape() -> int | None:
        async with httpx.AsyncClient(base_url=server.base_url) as client:
            return await scrape_recompiles(client)

    with server:
        before = asyncio.run(scrape())
        metrics.count_recompile("dit", 2)  # what the conductor does when a worker reports a recompile
        after = asyncio.run(scrape())
    assert (before, after) == (0, 2)


def test_suite_against_tiny_digits(tmp_path):
    from mstar.api.metrics import PrometheusMetrics

    server, spec = _tiny_server(PrometheusMetrics("tiny-digits"))
    updates: list[dict] = []
    with server:
        serve = ServeOptions(base_url=server.base_url, kind="image", model=spec.name, size="256x256")
        serve.num_inference_steps, serve.sizes = 2, ("256x256",)  # tiny-digits has one size
        options = SuiteOptions(
            serve=serve, num_steady=2, high_concurrency=2, num_high=2, num_mixed=2, company_sizes=["256x256"]
        )
        options.boot_s = 1.5
        options.new_size, options.new_size_settle_s = "256x256", 0.0  # its one size: the plumbing
        result = run_serve_suite(options, on_update=lambda r: updates.append(json.loads(json.dumps(r))))
    phases = result["phases"]
    assert set(phases) == {"steady_c1", "c2", "new_size_c1", "mixed"}
    assert result["new_size_first"]["ok"] and result["new_size_first"]["size"] == "256x256"
    assert result["cold"]["ok"] and result["cold"]["index"] == 0
    for phase in phases.values():
        assert phase["errors"] == {} and phase["num_completed"] == 2
    assert [r["size"] for r in phases["mixed"]["requests"]] == ["256x256", "256x256"]
    server_ms = phases["steady_c1"]["server_ms_per_request"]  # from the server's /metrics
    assert {"e2e", "encode"} <= set(server_ms) and any(stage.startswith("walk:") for stage in server_ms)
    assert 0 < server_ms["e2e"] < 1000 * phases["steady_c1"]["latency_mean_s"]
    s = result["summary"]
    assert s["boot_s"] == 1.5
    assert s["peak_gpu_allocated_c1_gib"] == 0.0  # read from the server's /metrics: no GPU here
    assert s["cold_over_steady"] == pytest.approx(s["cold_latency_s"] / s["steady_p50_s"])
    assert s["new_size_first_over_steady"] == pytest.approx(
        s["new_size_first_s"] / s["new_size_steady_p50_s"]
    )
    assert s["throughput_ratio"] == pytest.approx(s["per_minute_c2"] / s["per_minute_c1"])
    assert s["recompiles_in_traffic"] == 0 and s["recompiles_in_mixed"] == 0  # scraped, none on CPU eager
    parity = result["parity"]
    assert parity["repeat_alone"]["identical_bytes"] and parity["repeat_alone"]["psnr_db"] == math.inf
    company = parity["with_company"]
    assert company["company_overlapping"] == 1
    assert company["psnr_db"] is not None and company["psnr_db"] > 30  # batch company: float noise at most
    # every phase was published as it ended: a killed run keeps what it measured
    assert len(updates) >= 4 and "steady_c1" in updates[1]["phases"]
    table = suite_table(result)
    assert "| cold / steady |" in table and "| parity: alone vs with_company |" in table
    assert f"server e2e {server_ms['e2e']:.0f} (walks: " in table
    assert "| new size: first / steady |" in table


def test_time_guard_skips_what_does_not_fit():
    from mstar.api.metrics import PrometheusMetrics

    server, spec = _tiny_server(PrometheusMetrics("tiny-digits"))
    with server:
        serve = ServeOptions(base_url=server.base_url, kind="image", model=spec.name, num_inference_steps=2)
        options = SuiteOptions(serve=serve, num_steady=2, num_high=2, high_concurrency=2, num_mixed=2)
        options.max_duration_s = 0.0  # only the cold request is always sent
        result = run_serve_suite(options)
    assert result["cold"]["ok"] and result["phases"] == {}
    assert [note.split(":")[0] for note in result["skipped"]] == ["steady_c1", "c2", "mixed"]


def test_peak_memory_windows_cover_only_their_phase():
    from mstar.bench.gpu_memory import PeakMemoryPoller

    readings = iter([5, 9, 3, 4])
    poller = PeakMemoryPoller(interval_s=60.0, reader=("fake", lambda: next(readings) * 2**30))
    with poller:  # samples 5 at start
        poller._sample()  # 9: the boot-time peak
        poller.start_window()  # samples 3
        poller._sample()  # 4
    assert poller.peak_gib == 9.0 and poller.window_peak_gib == 4.0


def test_c1_stage_row_names_each_stage_and_when_media_was_ready():
    from mstar.bench.suite_report import summary_rows

    server_ms = {"e2e": 6432.0, "walk:encode_text": 9.9, "walk:t2v": 6421.7, "encode": 32.9, "ready": 6480.0}
    result = {
        "options": {"serve": {"kind": "video"}, "high_concurrency": 4},
        "phases": {"steady_c1": {"latency_mean_s": 6.573, "server_ms_per_request": server_ms}},
    }
    cell = dict((metric, value) for metric, value, _ in summary_rows(result))["c=1 ms a request (mean)"]
    assert cell == (
        "client 6573; server e2e 6432 (walks: encode_text 10, t2v 6422); media encode 32.9; media ready 6480"
    )
