"""The serve benchmark against OUR server: the real API app and the real Runtime (worker subprocesses),
serving tiny-digits once its trained weights have landed, else the API tests' numpy models."""

from __future__ import annotations

import pytest

from mstar.bench.serve import ServeOptions, run_serve_benchmark

live = pytest.importorskip("tests.api.live")
live_models = pytest.importorskip("tests.api.live_models")


def _image_spec():
    try:
        from mstar.models.tiny_digits.config import CONFIG_FILE, DIT_FILE, WEIGHTS_DIR
        from mstar.models.tiny_digits.model import TinyDigitsSpec
    except ImportError:
        return live_models.LiveImageSpec()
    if not all((WEIGHTS_DIR / name).exists() for name in (CONFIG_FILE, DIT_FILE)):
        return live_models.LiveImageSpec()
    return TinyDigitsSpec()


def _serve(spec):
    from mstar.api.app import create_app
    from mstar.config import ServerConfig

    return live.LiveServer(create_app(ServerConfig(model=spec.name, warmup=False), spec))


def _measured(result: dict) -> list[dict]:
    return [run for run in result["runs"] if run["mode"] != "warmup"]


def test_images_from_our_server():
    spec = _image_spec()
    with _serve(spec) as server:
        options = ServeOptions(
            base_url=server.base_url, kind="image", model=spec.name, num_requests=3, num_warmup=1
        )
        options.num_inference_steps = 2
        result = run_serve_benchmark(options, concurrencies=[1, 2])
    for run in _measured(result):
        assert run["errors"] == {}, run["errors"]
        assert run["num_completed"] == 3
        assert all(r["output_bytes"] > 100 for r in run["requests"])  # a base64 PNG came back
        assert 0 < run["latency_p50_s"] <= run["latency_p99_s"]


def test_videos_from_our_server_report_first_progress():
    spec = live_models.LiveVideoSpec()
    with _serve(spec) as server:
        options = ServeOptions(
            base_url=server.base_url,
            kind="video",
            model=spec.name,
            num_requests=3,
            num_warmup=0,
            poll_interval_s=0.05,
        )
        options.num_inference_steps, options.extra_body = 6, {"num_frames": 5}
        result = run_serve_benchmark(options, concurrencies=[3])
    (run,) = _measured(result)
    assert run["errors"] == {}, run["errors"]
    assert run["num_completed"] == 3
    assert all(r["output_bytes"] > 100 for r in run["requests"])  # an MP4 came back
    # 6 steps of 50 ms: the first poll with progress > 0 comes before the end
    assert 0 < run["first_progress_p50_s"] < run["latency_p50_s"]


def test_invalid_request_is_counted_as_http_400():
    spec = live_models.LiveVideoSpec()
    with _serve(spec) as server:
        options = ServeOptions(base_url=server.base_url, kind="video", num_requests=2, num_warmup=0)
        options.extra_body = {"num_frames": 6}  # not of the form 4k+1
        (run,) = _measured(run_serve_benchmark(options, concurrencies=[1]))
    assert run["errors"] == {"http_400": 2}
