"""The serving benchmark client against a fake OpenAI-shaped server with controlled delays and failures."""

from __future__ import annotations

import pytest

from mstar.bench.serve import (
    RequestRecord,
    ServeOptions,
    poisson_arrivals_s,
    request_body,
    run_serve_benchmark,
    summarize,
)
from mstar.bench.stats import percentile
from mstar.client.client import poll_wait_s
from tests.bench.fake_server import FakeBehaviour, FakeServer, free_port


def _measured(result: dict) -> list[dict]:
    return [run for run in result["runs"] if run["mode"] != "warmup"]


def test_images_closed_loop_counts_errors_and_concurrency():
    # seeds 0..7 are measured (seed = index); seed 3 fails with HTTP 500
    behaviour = FakeBehaviour(image_delay_s=0.1, fail_seeds={3})
    with FakeServer(behaviour) as server:
        options = ServeOptions(base_url=server.url, kind="image", num_requests=8, num_warmup=2, size="64x64")
        result = run_serve_benchmark(options, concurrencies=[1, 4])
    counters = server.counters
    # warmup (2) + two closed-loop levels of 8 each reached the server; warmup is not counted
    assert counters.num_image_requests == 2 + 8 + 8
    assert counters.max_in_flight == 4
    warmup, c1, c4 = result["runs"]
    assert warmup["mode"] == "warmup" and warmup["num_requests"] == 2
    for run in (c1, c4):
        assert run["num_requests"] == 8
        assert run["num_completed"] == 7
        assert run["errors"] == {"http_500": 1}
        assert run["latency_p50_s"] >= 0.1
        assert run["latency_p50_s"] <= run["latency_p95_s"] <= run["latency_p99_s"]
        assert run["first_progress_p50_s"] is None  # images report no progress
    # c=1: 8 requests back to back (>= 0.8 s); c=4: two waves (~0.2 s), so more throughput
    assert c1["window_s"] >= 0.8
    assert c4["window_s"] < c1["window_s"]
    assert c4["images_per_minute"] > c1["images_per_minute"]
    assert sorted(r["index"] for r in c4["requests"]) == list(range(8))


def test_the_same_prompts_and_seeds_every_run():
    with FakeServer(FakeBehaviour(image_delay_s=0.0)) as server:
        options = ServeOptions(base_url=server.url, num_requests=4, num_warmup=1, seed=100)
        run_serve_benchmark(options, concurrencies=[1, 2])
    warmup_seed, *measured = server.counters.seeds
    assert warmup_seed >= 100 + 4  # warmup never reuses a measured seed
    assert sorted(measured) == sorted([100, 101, 102, 103] * 2)


def test_a_prompt_tag_makes_every_prompt_but_request_zeros_new():
    plain = ServeOptions(base_url="http://unused", prompts=("a fox", "a koi pond"))
    tagged = ServeOptions(base_url="http://unused", prompts=("a fox", "a koi pond"), prompt_tag="c4")
    assert [request_body(plain, i)["prompt"] for i in range(3)] == ["a fox", "a koi pond", "a fox"]
    assert [request_body(tagged, i)["prompt"] for i in range(3)] == [
        "a fox",
        "a koi pond (c4 1)",
        "a fox (c4 2)",
    ]
    assert [request_body(tagged, i)["seed"] for i in range(3)] == [0, 1, 2]


def test_videos_poll_progress_and_count_failed_jobs():
    behaviour = FakeBehaviour(video_queue_s=0.05, video_duration_s=0.4, fail_seeds={1})
    with FakeServer(behaviour) as server:
        options = ServeOptions(
            base_url=server.url, kind="video", num_requests=4, num_warmup=0, poll_interval_s=0.02
        )
        result = run_serve_benchmark(options, concurrencies=[2])
    (run,) = _measured(result)
    assert server.counters.num_video_jobs == 4
    assert run["num_completed"] == 3
    assert run["errors"] == {"job_failed": 1}
    # first progress > 0 comes after the queue time and before the job ends
    assert 0.05 <= run["first_progress_p50_s"] < run["latency_p50_s"]
    assert run["latency_p50_s"] >= 0.4
    assert run["videos_per_minute"] > 0
    completed = [r for r in run["requests"] if r["ok"]]
    assert all(r["output_bytes"] == 400 for r in completed)
    # the job's end is seen by a poll after its 0.4 s and before the download ends
    assert all(0.4 <= r["ended_seen_s"] <= r["latency_s"] for r in completed)


def test_a_poll_interval_left_out_follows_the_servers_hint():
    assert poll_wait_s(0.05, {"openai-poll-after-ms": "300"}) == 0.05  # a fixed interval wins
    assert poll_wait_s(None, {"openai-poll-after-ms": "300"}) == 0.3  # the bench's 0
    assert poll_wait_s(None, {}) == 1.0  # no hint: the OpenAI SDK's default


def test_timeouts_and_connection_errors_are_counted_by_kind():
    behaviour = FakeBehaviour(image_delay_s=0.01, slow_seeds={0})
    with FakeServer(behaviour) as server:
        options = ServeOptions(base_url=server.url, num_requests=3, num_warmup=0, request_timeout_s=0.5)
        (run,) = _measured(run_serve_benchmark(options, concurrencies=[3]))
    assert run["errors"] == {"timeout": 1}
    assert run["num_completed"] == 2

    options = ServeOptions(base_url=f"http://127.0.0.1:{free_port()}", num_requests=2, num_warmup=0)
    (run,) = _measured(run_serve_benchmark(options, concurrencies=[1]))
    assert run["errors"] == {"connection": 2}
    assert run["latency_p50_s"] is None and run["images_per_minute"] == 0.0


def test_open_loop_sends_on_a_seeded_poisson_schedule():
    schedule = poisson_arrivals_s(200, request_rate=10.0, seed=7)
    assert schedule == poisson_arrivals_s(200, request_rate=10.0, seed=7)
    assert schedule != poisson_arrivals_s(200, request_rate=10.0, seed=8)
    assert schedule == sorted(schedule)
    assert 15.0 < schedule[-1] < 25.0  # 200 arrivals at 10/s take about 20 s
    with FakeServer(FakeBehaviour(image_delay_s=0.3)) as server:
        options = ServeOptions(base_url=server.url, num_requests=6, num_warmup=0)
        (run,) = _measured(run_serve_benchmark(options, concurrencies=[], request_rates=[50.0]))
    assert run["mode"] == "open" and run["request_rate"] == 50.0
    assert run["num_completed"] == 6
    # arrivals every ~20 ms while each takes 300 ms: the open loop does not wait for answers
    assert server.counters.max_in_flight >= 3


def test_summarize_percentiles_and_throughput_by_hand():
    records = [RequestRecord(index=i, start_s=0.0, end_s=float(i + 1), ok=True) for i in range(4)]
    records.append(RequestRecord(index=4, start_s=0.0, end_s=0.5, ok=False, error="http_429"))
    summary = summarize(records, "image")
    assert summary["latency_p50_s"] == pytest.approx(2.5)
    assert summary["latency_p95_s"] == pytest.approx(3.85)  # rank 2.85 between 3 and 4
    assert summary["errors"] == {"http_429": 1}
    assert summary["window_s"] == pytest.approx(4.0)
    assert summary["images_per_minute"] == pytest.approx(60.0)  # 4 done in 4 s
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0


def test_outputs_are_hashed_after_the_clock_stops_and_kept_only_when_asked(monkeypatch):
    """A record's latency ends when the client holds the image's bytes; the sha256 (parity's, not a
    user's cost) is taken after, and the bytes stay only with keep_media."""
    import asyncio
    import hashlib

    from mstar.bench import serve

    clock = iter(range(100))
    monkeypatch.setattr(serve.time, "perf_counter", lambda: float(next(clock)))
    real_sha256 = hashlib.sha256
    hashed_at: list[float] = []

    def sha256_noting_the_time(data):
        hashed_at.append(float(next(clock)))
        return real_sha256(data)

    monkeypatch.setattr(serve.hashlib, "sha256", sha256_noting_the_time)
    with FakeServer(FakeBehaviour()) as server:
        import httpx

        async def one(keep_media: bool) -> RequestRecord:
            options = ServeOptions(base_url=server.url, kind="image", size="64x64", keep_media=keep_media)
            async with httpx.AsyncClient(base_url=server.url) as client:
                return await serve.run_one(client, options, 0)

        dropped, kept = asyncio.run(one(False)), asyncio.run(one(True))
    for record, at in zip((dropped, kept), hashed_at, strict=True):
        assert record.ok and record.media_sha256 is not None
        assert record.start_s < record.end_s < at
    assert dropped.media is None
    assert kept.media is not None and real_sha256(kept.media).hexdigest() == kept.media_sha256
