"""An idle worker waits on its inbox, not on a timer: a message that arrives while it idles is
handled at once (here the idle wait is ten minutes long, so a timer would hang the test)."""

from __future__ import annotations

import os
import threading

import zmq

from mstar.config import ServerConfig
from mstar.runtime import messages as m
from mstar.runtime import worker as worker_module
from mstar.runtime.transport import bind_inbox, connect_push, send

HANG_GUARD_S = 60.0


class WatchedPoller(zmq.Poller):
    """The worker's poller, saying when it begins a wait of the idle length."""

    idle_wait_began = threading.Event()

    def poll(self, timeout=None):
        if timeout == worker_module.IDLE_POLL_MS:
            self.idle_wait_began.set()
        return super().poll(timeout)


class IdleLoop:
    """A step loop with nothing to run, recording the messages it is handed."""

    def __init__(self) -> None:
        self.handled: list[m.Message] = []
        self.arrived = threading.Event()

    def has_work(self) -> bool:
        return False

    def handle(self, message: m.Message) -> None:
        self.handled.append(message)
        self.arrived.set()

    def run_round(self, at_step_boundary) -> None:
        pass

    def report_step_times(self) -> None:
        pass

    def release_all(self) -> None:
        pass


def test_a_message_wakes_an_idle_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_POLL_MS", 600_000)
    monkeypatch.setattr(worker_module.zmq, "Poller", WatchedPoller)
    WatchedPoller.idle_wait_began.clear()
    context = zmq.Context()
    conductor, conductor_endpoint = bind_inbox(context, f"ipc://{tmp_path}/c.sock")
    boot = m.WorkerBoot(
        ServerConfig(model="tiny-digits").model_dump_json(), "unused:Spec", 0, 0,
        f"ipc://{tmp_path}/w.sock", conductor_endpoint, str(tmp_path), "test-",
    )  # fmt: skip
    worker = worker_module.Worker(boot, parent_pid=os.getppid())
    worker.loop = loop = IdleLoop()
    serving = threading.Thread(target=worker.serve, name="worker-serve", daemon=True)
    serving.start()
    to_worker = connect_push(context, worker.endpoint)
    try:
        assert WatchedPoller.idle_wait_began.wait(HANG_GUARD_S), "the worker never waited idle"
        send(to_worker, m.Release("r1"))  # arrives while the worker waits
        assert loop.arrived.wait(HANG_GUARD_S), "the idle worker did not wake for a message"
        assert loop.handled == [m.Release("r1")]
        send(to_worker, m.Shutdown())
        serving.join(HANG_GUARD_S)
        assert not serving.is_alive()
    finally:
        to_worker.close(linger=0)
        worker.close()
        conductor.close(linger=0)
        context.term()
