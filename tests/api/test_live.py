"""End to end: the official `openai` client and our SDK against a live uvicorn server whose app owns
the REAL Runtime (worker subprocesses). Images use the embedded tiny-digits model once it exists,
otherwise a numpy test model; videos use a numpy test video model (tiny-digits makes images)."""

from __future__ import annotations

import base64
import io
import time

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from mstar.api.app import create_app
from mstar.api.media import decode_mp4
from mstar.client import Client, MstarError
from mstar.config import ServerConfig
from tests.api.live import LiveServer
from tests.api.live_models import LiveImageSpec, LiveVideoSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks videos.* deprecated
KEY = "live-key"


def image_spec():
    """tiny-digits once its spec and trained weights have landed, else the numpy stand-in."""
    try:
        from mstar.models.tiny_digits.config import CONFIG_FILE, DIT_FILE, WEIGHTS_DIR
        from mstar.models.tiny_digits.model import TinyDigitsSpec
    except ImportError:
        return LiveImageSpec()
    if not all((WEIGHTS_DIR / name).exists() for name in (CONFIG_FILE, DIT_FILE)):
        return LiveImageSpec()
    return TinyDigitsSpec()


def serve(spec, **config_fields):
    config = ServerConfig(model=spec.name, api_key=KEY, warmup=False, **config_fields)
    return LiveServer(create_app(config, spec))


@pytest.fixture(scope="module")
def image_server():
    with serve(image_spec()) as server:
        yield server


@pytest.fixture(scope="module")
def video_server():
    with serve(LiveVideoSpec()) as server:
        yield server


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=60)


def test_openai_images_generate(image_server):
    spec_name = httpx.get(
        f"{image_server.base_url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}
    ).json()
    model = spec_name["data"][0]["id"]
    result = openai_client(image_server).images.generate(
        model=model, prompt="a handwritten 7", n=2, extra_body={"seed": 3, "num_inference_steps": 2}
    )
    images = [np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json)))) for item in result.data]
    assert len(images) == 2 and images[0].dtype == np.uint8 and images[0].ndim == 3
    assert result.size == f"{images[0].shape[1]}x{images[0].shape[0]}"
    assert not np.array_equal(images[0], images[1]), "n=2 must use seeds seed and seed+1"
    # Same seed again: equal up to float noise (the batch company of each step may differ between runs).
    again = openai_client(image_server).images.generate(
        model=model, prompt="a handwritten 7", n=2, extra_body={"seed": 3, "num_inference_steps": 2}
    )
    repeated = [np.asarray(Image.open(io.BytesIO(base64.b64decode(item.b64_json)))) for item in again.data]
    for first, second in zip(images, repeated, strict=True):
        assert np.abs(first.astype(int) - second.astype(int)).mean() < 0.5


def test_openai_images_url_and_jpeg(image_server):
    result = openai_client(image_server).images.generate(
        prompt="a 1", response_format="url", output_format="jpeg", extra_body={"num_inference_steps": 1}
    )
    response = httpx.get(result.data[0].url)  # a capability URL: no key needed
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    assert Image.open(io.BytesIO(response.content)).format == "JPEG"


def test_openai_errors_are_typed(image_server):
    client = openai_client(image_server)
    with pytest.raises(openai.BadRequestError) as bad:
        client.images.generate(prompt="x", n=0)
    assert bad.value.status_code == 400 and bad.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError):
        client.images.generate(prompt="x", model="dall-e-3")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{image_server.base_url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as mode:
        client.videos.create(prompt="x")
    assert mode.value.body["code"] == "unsupported_mode"


def test_openai_video_create_retrieve_download(video_server):
    client = openai_client(video_server)
    video = client.videos.create(
        model="live-video", prompt="a cat", seconds="1", size="32x48",
        extra_body={"fps": 8, "num_inference_steps": 4, "seed": 5},
    )  # fmt: skip
    assert video.status == "queued" and video.seconds == "1" and video.size == "32x48"
    seen_progress = set()
    deadline = time.monotonic() + 30
    while video.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.02)
        video = client.videos.retrieve(video.id)
        seen_progress.add(video.progress)
    assert video.status == "completed" and video.progress == 100
    assert any(0 < p < 100 for p in seen_progress), seen_progress
    frames = decode_mp4(client.videos.download_content(video.id).read())
    assert frames.shape == (9, 48, 32, 3)  # 1 s at 8 fps -> 4k+1 = 9 frames
    listed = client.videos.list(limit=10)
    assert video.id in [item.id for item in listed.data]


def test_openai_video_with_input_reference_and_cancel(video_server):
    client = openai_client(video_server)
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 128, 255)).save(buffer, format="PNG")
    video = client.videos.create(
        model="live-video", prompt="a cat", input_reference=("ref.png", buffer.getvalue(), "image/png"),
        extra_body={"num_frames": 5, "num_inference_steps": 40},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while video.status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.02)
        video = client.videos.retrieve(video.id)
    deleted = client.videos.delete(video.id)
    assert deleted.deleted is True and deleted.id == video.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    metrics = httpx.get(f"{video_server.base_url}/metrics").text
    assert 'outcome="aborted"' in metrics or "num_requests_running" in metrics
    deadline = time.monotonic() + 10
    while 'mstar:num_requests_running{model_name="live-video"} 0.0' not in metrics:
        assert time.monotonic() < deadline, "the cancelled request kept running"
        time.sleep(0.05)
        metrics = httpx.get(f"{video_server.base_url}/metrics").text
    assert 'mstar:requests_total{model_name="live-video",outcome="aborted"}' in metrics


def test_sdk_against_live_servers(image_server, video_server):
    with Client(image_server.base_url, api_key=KEY) as client:
        assert client.health() and client.ready()
        png = client.generate_image("a 4", seed=1, num_inference_steps=1)
        assert png.startswith(b"\x89PNG")
        with pytest.raises(MstarError) as error:
            client.generate_image("x", num_inference_steps=0)
        assert error.value.status_code == 400 and error.value.param == "num_inference_steps"
    progress: list[int] = []
    with Client(video_server.base_url, api_key=KEY) as client:
        mp4 = client.generate_video(
            "a dog", num_frames=5, num_inference_steps=4, on_progress=progress.append, poll_interval_s=0.02
        )
    assert decode_mp4(mp4).shape[0] == 5
    assert progress[-1] == 100 and progress == sorted(progress)


def test_live_health_ready_metrics(video_server):
    assert httpx.get(f"{video_server.base_url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{video_server.base_url}/ready").status_code == 200
    metrics = httpx.get(f"{video_server.base_url}/metrics").text
    assert 'mstar:step_duration_seconds_count{model_name="live-video",node="dit"}' in metrics


def test_client_that_goes_away_aborts_its_image_requests():
    from mstar.api.metrics import PrometheusMetrics
    from tests.api.fakes import FakeImageSpec, FakeRuntime

    spec = FakeImageSpec()
    metrics = PrometheusMetrics(spec.name)
    runtime = FakeRuntime(metrics=metrics, step_delay_s=0.1)
    app = create_app(ServerConfig(model=spec.name), spec, runtime, metrics=metrics)
    with LiveServer(app) as server:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/images/generations", timeout=0.3,
                       json={"prompt": "x", "n": 2, "num_inference_steps": 50})  # fmt: skip
        deadline = time.monotonic() + 5
        while len(runtime.aborted) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(runtime.aborted) == 2


def test_sdk_reports_failed_jobs_and_sends_reference_uploads():
    from mstar.api.metrics import PrometheusMetrics
    from tests.api.fakes import FakeRuntime, FakeVideoSpec

    spec = FakeVideoSpec()
    metrics = PrometheusMetrics(spec.name)
    runtime = FakeRuntime(metrics=metrics)
    app = create_app(ServerConfig(model=spec.name), spec, runtime, metrics=metrics)
    buffer = io.BytesIO()
    Image.new("RGB", (24, 16), (5, 6, 7)).save(buffer, format="PNG")
    with LiveServer(app) as server, Client(server.base_url) as client:
        mp4 = client.generate_video(
            "x", num_frames=5, input_reference=buffer.getvalue(), poll_interval_s=0.01
        )
        assert decode_mp4(mp4).shape == (5, 32, 32, 3)
        params, inputs = runtime.submitted[-1]
        assert params.has_input_reference and inputs["input_reference"].shape == (16, 24, 3)
        runtime.fail_kind = "timeout"
        with pytest.raises(MstarError) as error:
            client.generate_video("x", num_frames=5, poll_interval_s=0.01)
        assert error.value.code == "timeout"


def test_native_stream_closed_early_aborts():
    from mstar.api.metrics import PrometheusMetrics
    from tests.api.fakes import FakeImageSpec, FakeRuntime

    spec = FakeImageSpec()
    metrics = PrometheusMetrics(spec.name)
    runtime = FakeRuntime(metrics=metrics, step_delay_s=0.05)
    app = create_app(ServerConfig(model=spec.name), spec, runtime, metrics=metrics)
    with LiveServer(app) as server:
        body = {"prompt": "x", "num_inference_steps": 50}
        with httpx.stream("POST", f"{server.base_url}/generate", json=body, timeout=10) as response:
            first = next(response.iter_lines())
            assert '"type": "progress"' in first
        deadline = time.monotonic() + 5
        while not runtime.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(runtime.aborted) == 1


def test_openai_poll_helper_polls_at_the_floor_its_first_hint_sets(video_server):
    """The SDK's poll helper keeps the hint of its first poll for the whole job. That poll comes
    before any step's pace is known, and such a job's hint is the floor (for every client)."""
    from mstar.api.routes_videos import MIN_POLL_AFTER_MS

    hints: list[tuple[str, str | None]] = []

    def record(response: httpx.Response) -> None:
        if "/v1/videos" in response.request.url.path:
            hints.append((response.request.method, response.headers.get("openai-poll-after-ms")))

    http_client = httpx.Client(event_hooks={"response": [record]})
    client = openai.OpenAI(
        base_url=f"{video_server.base_url}/v1",
        api_key=KEY,
        max_retries=0,
        timeout=60,
        http_client=http_client,
    )
    body = {
        "model": "live-video",
        "prompt": "a cat",
        "size": "32x48",
        "extra_body": {"num_inference_steps": 30},
    }
    video = client.videos.create(**body)  # 30 steps of 50 ms
    assert hints[-1] == ("POST", str(MIN_POLL_AFTER_MS))
    video = client.videos.poll(video.id)
    assert video.status == "completed"
    assert hints[1][0] == "GET" and hints[1][1] == str(MIN_POLL_AFTER_MS)  # the helper's first poll
