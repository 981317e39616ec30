"""Fixtures: an app over the fake runtime, driven through Starlette's TestClient."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from mstar.api.app import create_app
from mstar.api.metrics import PrometheusMetrics
from mstar.config import ServerConfig
from tests.api.fakes import FakeImageSpec, FakeRuntime, FakeVideoSpec


def build_client(spec=None, api_key=None, step_delay_s=0.0, max_active=64, **config_fields):
    spec = spec or FakeImageSpec()
    config = ServerConfig(model=spec.name, api_key=api_key, **config_fields)
    metrics = PrometheusMetrics(spec.name)
    runtime = FakeRuntime(metrics=metrics, step_delay_s=step_delay_s, max_active=max_active)
    app = create_app(config, spec, runtime, metrics=metrics)
    # A loopback name: the app refuses others (TestClient's default is "testserver").
    client = TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)
    return client, runtime


def wait_for(client, video_id, statuses=("completed", "failed"), timeout_s=10.0):
    """Poll a video job until its status is one of `statuses`; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/v1/videos/{video_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.01)
    raise AssertionError(f"video {video_id} stayed {job['status']}")


@pytest.fixture
def image_client():
    client, runtime = build_client(FakeImageSpec())
    with client:
        yield client, runtime


@pytest.fixture
def video_client():
    client, runtime = build_client(FakeVideoSpec(), step_delay_s=0.005)
    with client:
        yield client, runtime
