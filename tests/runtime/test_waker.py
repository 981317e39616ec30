"""A node that turns a request ready off the step loop (an adapter loaded on its thread) wakes the
worker's idle poll: the waker's pipe ends a poll at once, and the worker's serve loop runs a round
when woken instead of at its idle timeout."""

import threading

import zmq

from mstar.config import ServerConfig
from mstar.runtime import messages as m
from mstar.runtime import worker as worker_module
from mstar.runtime.waker import Waker

HANG_GUARD_MS = 60_000


def test_a_wake_from_another_thread_ends_the_poll_and_clear_rearms_it():
    waker = Waker()
    poller = zmq.Poller()
    poller.register(waker.fileno(), zmq.POLLIN)
    threading.Thread(target=waker.wake).start()
    assert dict(poller.poll(HANG_GUARD_MS)) == {waker.fileno(): zmq.POLLIN}
    waker.clear()
    assert poller.poll(0) == []
    waker.close()


def test_many_wakes_never_block_one_clear_drains_them_and_a_wake_after_close_is_harmless():
    waker = Waker()
    for _ in range(70_000):  # more bytes than a pipe holds: the extra wakes are dropped
        waker.wake()
    waker.clear()
    poller = zmq.Poller()
    poller.register(waker.fileno(), zmq.POLLIN)
    assert poller.poll(0) == []
    waker.close()
    waker.wake()
    waker.close()


class _Loop:
    """The step loop as serve sees it: no work until `ready`, then one round that stops the worker."""

    def __init__(self, worker):
        self.worker = worker
        self.idle = threading.Event()  # serve asked for work and found none: it goes to its poll
        self.ready = threading.Event()
        self.rounds = 0

    def has_work(self) -> bool:
        if not self.ready.is_set():
            self.idle.set()
        return self.ready.is_set()

    def run_round(self, at_step_boundary) -> None:
        self.rounds += 1
        self.worker.stopping = True

    def report_step_times(self) -> None:
        pass

    def release_all(self) -> None:
        pass


def test_the_serve_loop_runs_when_woken_not_at_its_idle_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_module, "IDLE_POLL_MS", 10 * HANG_GUARD_MS)  # a wake or nothing
    boot = m.WorkerBoot(
        ServerConfig().model_dump_json(), "unused:Spec", 0, 0, "tcp://127.0.0.1:*", "tcp://127.0.0.1:9",
        str(tmp_path), "test",
    )  # fmt: skip
    worker = worker_module.Worker(boot)
    loop = worker.loop = _Loop(worker)
    serving = threading.Thread(target=worker.serve, daemon=True)
    serving.start()
    try:
        assert loop.idle.wait(HANG_GUARD_MS / 1000)
        loop.ready.set()  # as an adapter's load finishing on the loader thread does
        worker.waker.wake()
        serving.join(HANG_GUARD_MS / 1000)
        assert not serving.is_alive() and loop.rounds == 1
    finally:
        worker.stopping = True
        worker.waker.wake()
        serving.join(HANG_GUARD_MS / 1000)
        worker.close()
