"""A worker frozen with SIGSTOP, behind a live server over the REAL Runtime: after two missed
heartbeats /ready is 503 and a new request gets 503 with Retry-After at once (it does not wait for
the worker); once the worker runs again, so does the server."""

from __future__ import annotations

import os
import signal
import time

import httpx

from mstar.api.app import create_app
from mstar.config import ServerConfig
from tests.api.live import LiveServer
from tests.api.live_models import LiveImageSpec

IMAGE = {"prompt": "a 7", "num_inference_steps": 2}
HANG_GUARD_S = 30.0
STALL_GUARD_S = 20.0  # stalls show after 0.5 s here; the old 30 s heartbeat timeout came later


def _wait_for_ready_status(base_url: str, status: int, guard_s: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + guard_s
    while httpx.get(f"{base_url}/ready").status_code != status:
        assert time.monotonic() < deadline, f"/ready never answered {status}"
        time.sleep(0.05)


def test_frozen_worker_turns_ready_503_and_new_requests_get_503_at_once():
    spec = LiveImageSpec()
    # The timeout is far off: the worker must be seen stalled long before it would be killed.
    config = ServerConfig(model=spec.name, warmup=False, heartbeat_interval_s=0.2, heartbeat_timeout_s=300.0)
    app = create_app(config, spec)
    with LiveServer(app) as live:
        url = f"{live.base_url}/v1/images/generations"
        assert httpx.post(url, json=IMAGE, timeout=HANG_GUARD_S).status_code == 200
        worker_pid = app.state.mstar.runtime.worker_pids()[0]
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            _wait_for_ready_status(live.base_url, 503, STALL_GUARD_S)
            # A request accepted here would wait for the frozen worker until the hang guard.
            refused = httpx.post(url, json=IMAGE, timeout=HANG_GUARD_S)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "not_ready"
            assert int(refused.headers["retry-after"]) > 0
        finally:
            os.kill(worker_pid, signal.SIGCONT)
        _wait_for_ready_status(live.base_url, 200)
        assert httpx.post(url, json=IMAGE, timeout=HANG_GUARD_S).status_code == 200
        assert app.state.mstar.runtime.worker_pids()[0] == worker_pid
