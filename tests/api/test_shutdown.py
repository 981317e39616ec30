"""SIGTERM and SIGINT to a real `mstar serve` with requests in flight: the one that can finish within
shutdown_grace_s finishes, the one that cannot gets a 503, the workers are stopped, and the process
exits 0 leaving no process, socket directory or shared-memory segment behind."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.api.test_cli import read_until, start_serve

SLOW_SPEC = "tests.api.live_models:SlowImageSpec"  # 0.1 s a step
GRACE_S = 6.0
SHORT_STEPS, LONG_STEPS = 20, 300  # ~2 s: inside the grace; ~30 s: far past it
HANG_GUARD_S = 60.0
WORKER_PID = re.compile(r"worker \d+ \(.*\) starting, pid (\d+)")


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Collect(threading.Thread):
    """Runs `work` in a thread and keeps what it returns (or raises)."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error


def _stream_lines(base_url: str, progressed: threading.Event) -> list[dict]:
    body = {"prompt": "a 1", "num_inference_steps": SHORT_STEPS}
    lines = []
    with httpx.stream("POST", f"{base_url}/generate", json=body, timeout=HANG_GUARD_S) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(json.loads(line))
            progressed.set()
    return lines


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_drains_answers_and_leaves_nothing(tmp_path: Path, stop_signal):
    config = tmp_path / "server.yaml"
    config.write_text(f"warmup: false\nshutdown_grace_s: {GRACE_S}\n")
    run_root = tmp_path / "tmp"  # the server's private socket directory is made under TMPDIR
    run_root.mkdir()
    process = start_serve(SLOW_SPEC, "--port", "0", "--config", str(config), TMPDIR=str(run_root))
    stderr_lines: list[str] = []
    reader = threading.Thread(target=lambda: stderr_lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        base_url = read_until(process.stdout, "mstar: serving")[-1].split(" on ")[1].split()[0]
        images = f"{base_url}/v1/images/generations"
        long_body = {"prompt": "a 2", "num_inference_steps": LONG_STEPS}
        long = Collect(lambda: httpx.post(images, json=long_body, timeout=HANG_GUARD_S))
        long.start()
        progressed = threading.Event()
        short = Collect(lambda: _stream_lines(base_url, progressed))
        short.start()
        assert progressed.wait(HANG_GUARD_S), "the short request never started"  # both are running now
        worker_pids = [int(pid) for pid in WORKER_PID.findall("".join(stderr_lines))]
        assert worker_pids and all(_process_exists(pid) for pid in worker_pids)
        process.send_signal(stop_signal)
        if stop_signal == signal.SIGTERM:
            for pid in worker_pids:  # as systemd stops a service: every process gets the SIGTERM
                os.kill(pid, signal.SIGTERM)
        short.join(HANG_GUARD_S)
        long.join(HANG_GUARD_S)
        assert process.wait(timeout=HANG_GUARD_S) == 0, "".join(stderr_lines)[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert short.error is None and long.error is None, (short.error, long.error)
    kinds = [line["type"] for line in short.result]
    assert kinds[-2:] == ["output", "done"], short.result[-1]  # finished within the grace
    refused = long.result
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert int(refused.headers["retry-after"]) > 0
    reader.join(HANG_GUARD_S)
    assert not [pid for pid in worker_pids if _process_exists(pid)], "a worker outlived the server"
    assert list(run_root.iterdir()) == [], "the ipc socket directory was left behind"
    segment_prefix = f"mstar-{process.pid:x}"
    if os.path.isdir("/dev/shm"):
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(segment_prefix)]


def test_stop_signal_during_boot_exits_0_and_leaves_nothing(tmp_path: Path):
    run_root = tmp_path / "tmp"
    run_root.mkdir()
    process = start_serve("tests.api.live_models:SlowBootImageSpec", "--port", "0", TMPDIR=str(run_root))
    try:
        started = read_until(process.stderr, "starting, pid")  # a worker is building its nodes
        worker_pids = [int(pid) for pid in WORKER_PID.findall("".join(started))]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=HANG_GUARD_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and "stopped during boot" in stderr, stderr[-2000:]
    assert worker_pids and not [pid for pid in worker_pids if _process_exists(pid)]
    assert list(run_root.iterdir()) == []
