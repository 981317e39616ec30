"""Worker crashes, boot failures, admission limits and clean shutdown."""

import os
import signal

import pytest

from mstar.config import NodeGroup
from mstar.errors import Overloaded, RequestFailed
from mstar.runtime.events import Failed
from mstar.runtime.runtime import Runtime
from tests.runtime.fake_models import BrokenBootSpec, FakeParams, FakeSpec, expected_frame_value
from tests.runtime.helpers import final_event, make_config, run, until_progress, wait_for

LONG = FakeParams(seed=1, steps=1000, step_sleep_s=0.02)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_worker_fails_its_requests_and_is_restarted(loop):
    runtime = Runtime(make_config(), FakeSpec())
    run(loop, runtime.start())
    try:
        handle = runtime.submit(LONG)
        events = handle.events()
        run(loop, until_progress(events, 2))
        old_pids = runtime.worker_pids()
        os.kill(old_pids[1], signal.SIGKILL)  # the denoiser's worker, mid-loop
        event = run(loop, final_event(events), timeout_s=10.0)  # the request had 20 s left
        assert isinstance(event, Failed) and event.kind == "worker_died"
        assert not runtime.ready  # the replacement is still booting
        run(loop, wait_for(lambda: runtime.ready, timeout_s=20.0))
        new_pids = runtime.worker_pids()
        assert new_pids[0] == old_pids[0] and new_pids[1] not in (None, old_pids[1])
        outputs = run(loop, runtime.submit(FakeParams(seed=7, steps=3)).result())
        assert int(outputs["frames"][0, 0, 0, 0]) == expected_frame_value(7, 3)
    finally:
        run(loop, runtime.shutdown(timeout_s=1.0))


def test_frozen_worker_is_killed_after_the_heartbeat_timeout(loop):
    config = make_config(node_groups=[], heartbeat_interval_s=0.25, heartbeat_timeout_s=2.0)
    runtime = Runtime(config, FakeSpec())
    run(loop, runtime.start())
    try:
        events = runtime.submit(LONG).events()
        run(loop, until_progress(events, 1))
        frozen_pid = runtime.worker_pids()[0]
        os.kill(frozen_pid, signal.SIGSTOP)  # alive but silent
        event = run(loop, final_event(events), timeout_s=10.0)
        assert isinstance(event, Failed) and event.kind == "worker_died"
        assert not _process_exists(frozen_pid)
        run(loop, wait_for(lambda: runtime.ready, timeout_s=20.0))
        outputs = run(loop, runtime.submit(FakeParams(seed=2, steps=2)).result())
        assert int(outputs["frames"][0, 0, 0, 0]) == expected_frame_value(2, 2)
    finally:
        run(loop, runtime.shutdown(timeout_s=1.0))


def test_stalled_worker_is_not_ready_holds_admission_and_recovers(loop):
    config = make_config(node_groups=[], heartbeat_interval_s=0.2, heartbeat_timeout_s=120.0)
    runtime = Runtime(config, FakeSpec())
    run(loop, runtime.start())
    frozen_pid = runtime.worker_pids()[0]
    try:
        running = runtime.submit(FakeParams(seed=3, steps=30, step_sleep_s=0.02))
        run(loop, until_progress(running.events(), 1))
        os.kill(frozen_pid, signal.SIGSTOP)
        run(loop, wait_for(lambda: not runtime.ready, timeout_s=20.0))  # two beats missed
        waiting = runtime.submit(FakeParams(seed=4, steps=2))
        assert runtime.stats().num_waiting == 1, "a request went to a stalled worker"
        os.kill(frozen_pid, signal.SIGCONT)
        run(loop, wait_for(lambda: runtime.ready, timeout_s=20.0))
        assert runtime.worker_pids()[0] == frozen_pid  # resumed, not restarted
        assert int(run(loop, running.result())["frames"][0, 0, 0, 0]) == expected_frame_value(3, 30)
        assert int(run(loop, waiting.result())["frames"][0, 0, 0, 0]) == expected_frame_value(4, 2)
    finally:
        os.kill(frozen_pid, signal.SIGCONT)
        run(loop, runtime.shutdown(timeout_s=1.0))


def test_queue_full_raises_overloaded_over_tcp_and_no_restart_fails_fast(loop):
    config = make_config(
        node_groups=[], transport="tcp", max_concurrent_requests=1, max_queue_size=1, worker_restart=False
    )
    runtime = Runtime(config, FakeSpec())
    run(loop, runtime.start())
    try:
        running = runtime.submit(LONG)
        waiting = runtime.submit(FakeParams(seed=4, steps=2))
        assert (runtime.stats().num_running, runtime.stats().num_waiting) == (1, 1)
        with pytest.raises(Overloaded):
            runtime.submit(FakeParams(seed=5))
        run(loop, until_progress(running.events(), 1))
        assert runtime.abort(running.request_id)
        assert int(run(loop, waiting.result())["frames"][0, 0, 0, 0]) == expected_frame_value(4, 2)
        os.kill(runtime.worker_pids()[0], signal.SIGKILL)  # and worker_restart is off
        run(loop, wait_for(lambda: not runtime.ready))
        with pytest.raises(RequestFailed) as failure:
            run(loop, runtime.submit(FakeParams(seed=1)).result())
        assert failure.value.kind == "worker_died"
    finally:
        run(loop, runtime.shutdown(timeout_s=1.0))


def test_boot_failure_raises_with_the_worker_error(loop):
    runtime = Runtime(make_config(model="ignored"), BrokenBootSpec())
    with pytest.raises(RuntimeError, match="cannot run on device 'cpu'") as failure:
        run(loop, runtime.start())
    assert "failed to boot" in str(failure.value)
    assert all(pid is None for pid in runtime.worker_pids())
    assert not runtime.ready


def test_shutdown_fails_in_flight_requests_and_leaves_nothing(loop):
    runtime = Runtime(make_config(), FakeSpec())
    run(loop, runtime.start())
    pids = runtime.worker_pids()
    run_dir = runtime._run_dir
    handle = runtime.submit(LONG)
    run(loop, until_progress(handle.events(), 1))
    run(loop, runtime.shutdown(timeout_s=0.2))
    with pytest.raises(RequestFailed) as failure:
        run(loop, handle.result())
    assert failure.value.kind == "shutdown"
    assert not runtime.ready
    assert not any(_process_exists(pid) for pid in pids)
    assert runtime._store.list_segments() == [] and not os.path.exists(run_dir)
    with pytest.raises(Overloaded):
        runtime.submit(FakeParams(seed=1))


def test_placement_errors_surface_before_any_process_starts():
    with pytest.raises(ValueError, match="decoder"):
        Runtime(make_config(node_groups=[NodeGroup(nodes=["encoder", "aux", "denoiser"])]), FakeSpec())


def test_worker_whose_api_process_died_before_it_started_exits(tmp_path):
    """The API process can die between spawning a worker and the worker's start (a SIGKILL during a
    restart): the worker must not take its new parent (pid 1) for the API process and live on."""
    import subprocess
    import sys

    import msgspec

    from mstar.runtime import messages as m

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    config = make_config(node_groups=[], heartbeat_interval_s=0.2, heartbeat_timeout_s=5.0)
    boot = m.WorkerBoot(
        config.model_dump_json(), config.model, 0, 1, f"ipc://{tmp_path}/w.sock",
        f"ipc://{tmp_path}/c.sock", str(tmp_path), "mstar-test-",
    )  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-m", "mstar.runtime.worker", "--worker", "0", "--parent-pid", str(gone.pid)],
        stdin=subprocess.PIPE,
    )
    worker.communicate(msgspec.json.encode(boot), timeout=60)  # hang guard: it must leave by itself
    assert worker.returncode == 1  # its orphan exit (not a usage error, 2)
