"""The API key guard (on and off) and the Prometheus metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import build_client, wait_for

KEY = "s3cret-key"
IMAGE = {"prompt": "a 3", "num_inference_steps": 2}
GUARDED = [
    ("GET", "/v1/models"),
    ("GET", "/v1/videos"),
    ("POST", "/v1/images/generations"),
    ("POST", "/generate"),
    ("DELETE", "/v1/videos/video_x"),
]


@pytest.fixture(scope="module")
def keyed_client():
    client, _ = build_client(api_key=KEY)
    with client:
        yield client


@pytest.mark.parametrize(("method", "path"), GUARDED)
@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Bearer {KEY}x", KEY, f"Basic {KEY}", "Bearer "])
def test_key_required_on_v1_and_generate(keyed_client, method, path, header):
    headers = {} if header is None else {"Authorization": header}
    response = keyed_client.request(method, path, headers=headers, json=IMAGE)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_right_key_passes_and_open_routes_stay_open(keyed_client):
    authorized = {"Authorization": f"Bearer {KEY}"}
    assert keyed_client.post("/v1/images/generations", json=IMAGE, headers=authorized).status_code == 200
    assert keyed_client.get("/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    for path in ("/health", "/ready", "/metrics"):
        assert keyed_client.get(path).status_code == 200


def test_key_checked_before_body_limit():
    client, _ = build_client(api_key=KEY, max_body_bytes=1024)
    with client:
        response = client.post("/v1/images/generations", content=b"x" * 4096)
        assert response.status_code == 401


def test_no_key_configured_means_open(image_client):
    client, _ = image_client
    assert client.post("/v1/images/generations", json=IMAGE).status_code == 200
    assert (
        client.post("/v1/images/generations", json=IMAGE, headers={"Authorization": "Bearer any"}).status_code
        == 200
    )


def scrape(client) -> dict[tuple[str, tuple], float]:
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_present_and_moving(image_client):
    client, runtime = image_client
    model = ("model_name", "fake-image")
    before = scrape(client)
    for name in ("mstar:num_requests_running", "mstar:num_requests_waiting"):
        assert (name, (model,)) in before
    assert client.post("/v1/images/generations", json={**IMAGE, "n": 2}).status_code == 200
    runtime.metrics.count_recompile("dit", 2)
    runtime.metrics.count_node_events("text_encoder", {"prompt_cache_hits": 3, "prompt_cache_misses": 0})
    runtime.metrics.count_node_events("text_encoder", {"prompt_cache_hits": 1})
    after = scrape(client)
    completed = ("mstar:requests_total", (model, ("outcome", "completed")))
    assert after[completed] - before.get(completed, 0) == 2
    steps = ("mstar:step_duration_seconds_count", (model, ("node", "dit")))
    assert after[steps] - before.get(steps, 0) == 4  # 2 requests x 2 steps
    assert after[("mstar:step_batch_size_count", (model, ("node", "dit")))] >= 4
    assert after[("mstar:step_tokens_sum", (model, ("node", "dit")))] >= 4 * 64
    assert after[("mstar:e2e_request_latency_seconds_count", (model,))] >= 2
    assert after[("mstar:request_queue_time_seconds_count", (model,))] >= 2
    assert after[("mstar:recompiles_total", (model, ("node", "dit")))] == 2
    encodes = ("mstar:media_encode_seconds_count", (("format", "png"), model))
    assert after[encodes] - before.get(encodes, 0) == 1  # one response: both images and the body
    ready = ("mstar:media_ready_seconds_count", (("format", "png"), model))
    assert after[ready] - before.get(ready, 0) == 1
    hits = ("mstar:node_events_total", (("event", "prompt_cache_hits"), model, ("node", "text_encoder")))
    assert after[hits] == 4
    assert (
        "mstar:node_events_total",
        (("event", "prompt_cache_misses"), model, ("node", "text_encoder")),
    ) not in after


def test_video_jobs_report_their_mp4_encode_and_when_it_was_ready(video_client):
    client, runtime = video_client
    runtime.step_delay_s = 0.05
    labels = (("format", "mp4"), ("model_name", "fake-video"))
    encodes, ready = ("mstar:media_encode_seconds_count", labels), ("mstar:media_ready_seconds_count", labels)
    ready_sum = ("mstar:media_ready_seconds_sum", labels)
    before = scrape(client)
    job = client.post("/v1/videos", json={"prompt": "x", "num_frames": 5, "num_inference_steps": 2}).json()
    assert wait_for(client, job["id"])["status"] == "completed"
    after = scrape(client)
    assert after[encodes] - before.get(encodes, 0) == 1
    assert after[ready] - before.get(ready, 0) == 1
    assert after[ready_sum] - before.get(ready_sum, 0) >= 0.1  # two steps of 50 ms at least


def test_running_gauge_reads_runtime_stats(video_client):
    client, runtime = video_client
    runtime.step_delay_s = 0.05
    job = client.post("/v1/videos", json={"prompt": "x", "num_frames": 5, "num_inference_steps": 50}).json()
    running = ("mstar:num_requests_running", (("model_name", "fake-video"),))
    assert scrape(client)[running] == 1
    client.delete(f"/v1/videos/{job['id']}")


def test_metrics_registries_are_per_app():
    first, _ = build_client()
    second, _ = build_client()
    with first, second:
        first.post("/v1/images/generations", json=IMAGE)
        completed = ("mstar:requests_total", (("model_name", "fake-image"), ("outcome", "completed")))
        assert scrape(first)[completed] == 1
        assert completed not in scrape(second)
