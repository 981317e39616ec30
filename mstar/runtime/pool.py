"""The worker processes of one server, seen from the API process: spawn, watch, restart, address.

A worker is down from the moment its process exits or its heartbeats stop until its next
incarnation reports Ready. Peers learn each other's endpoints from `Peers` broadcasts.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import msgspec
import zmq

from mstar.config import NodeGroup
from mstar.runtime import messages as m
from mstar.runtime.transport import Outboxes, bind_endpoint

# A worker silent this many heartbeat intervals missed two beats (the half absorbs jitter): stalled.
STALLED_AFTER_INTERVALS = 2.5
MAX_RESTART_BACKOFF_S = 30.0
EXIT_WAIT_S = 5.0

log = logging.getLogger("mstar.runtime")


@dataclass
class WorkerProcess:
    index: int
    group: NodeGroup
    incarnation: int = 0
    popen: subprocess.Popen | None = None
    endpoint: str = ""  # set by Ready; "" while down
    last_heartbeat: float = 0.0
    num_requests: int = 0
    num_boot_failures: int = 0
    restart_at: float | None = None  # monotonic time of the next spawn attempt
    boot_error: str = ""
    released: list[str] = field(default_factory=list)
    peers_version: int = -1  # the newest Peers table it applied (PeersKnown)
    stalled: bool = False  # up, but missed two heartbeats (frozen, or hung in native code)

    @property
    def is_up(self) -> bool:
        return bool(self.endpoint)


class WorkerPool:
    def __init__(
        self,
        groups: list[NodeGroup],
        boot_template: m.WorkerBoot,
        transport: str,
        run_dir: str,
        heartbeat_interval_s: float = 1.0,
        heartbeat_timeout_s: float = 30.0,
    ):
        """A worker silent for heartbeat_timeout_s is killed (exits are seen by polling at once)."""
        self.workers = [WorkerProcess(index, group) for index, group in enumerate(groups)]
        self.stalled_after_s = STALLED_AFTER_INTERVALS * heartbeat_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._template = boot_template
        self._transport = transport
        self._run_dir = run_dir
        self._context = zmq.Context()
        self.outboxes = Outboxes(self._context)
        self.peers_version = 0  # Peers broadcasts so far

    # ---- lifecycle -----------------------------------------------------------------------

    def spawn(self, index: int, released: list[str] = ()) -> None:
        worker = self.workers[index]
        worker.incarnation += 1
        worker.endpoint, worker.restart_at, worker.boot_error = "", None, ""
        worker.peers_version, worker.stalled = -1, False
        worker.last_heartbeat = time.monotonic()
        boot = msgspec.structs.replace(
            self._template,
            worker=index,
            incarnation=worker.incarnation,
            bind_endpoint=bind_endpoint(self._transport, self._run_dir, f"w{index}-{worker.incarnation}"),
            released=list(released),
        )
        # The worker imports the spec's module by name: give it the API process's import path.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
        worker.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mstar.runtime.worker",
                "--worker",
                str(index),
                "--parent-pid",
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            env=env,
            start_new_session=True,  # Ctrl-C goes to the API process, which shuts workers down
        )
        worker.popen.stdin.write(msgspec.json.encode(boot))
        worker.popen.stdin.close()
        log.info("worker %d (%s) starting, pid %d", index, ",".join(worker.group.nodes), worker.popen.pid)

    def on_ready(self, message: m.Ready) -> bool:
        worker = self.workers[message.worker]
        if message.incarnation != worker.incarnation:
            return False
        worker.endpoint = message.endpoint
        worker.num_boot_failures = 0
        worker.last_heartbeat = time.monotonic()
        self.outboxes.set_endpoint(worker.index, message.endpoint)
        self.broadcast_peers()
        log.info("worker %d ready", worker.index)
        return True

    def on_boot_failed(self, message: m.BootFailed) -> bool:
        worker = self.workers[message.worker]
        if message.incarnation != worker.incarnation:
            return False
        worker.boot_error = message.error
        return True

    def on_peers_known(self, message: m.PeersKnown) -> bool:
        """True when this ack makes every worker that is up hold the newest table."""
        worker = self.workers[message.worker]
        if message.incarnation != worker.incarnation:
            return False
        worker.peers_version = max(worker.peers_version, message.version)
        return self.peers_settled

    @property
    def peers_settled(self) -> bool:
        return all(w.peers_version == self.peers_version for w in self.workers if w.is_up)

    def on_heartbeat(self, message: m.Heartbeat) -> bool:
        """True when the beat ends a stall (the requests it held back may be admitted)."""
        worker = self.workers[message.worker]
        if message.incarnation != worker.incarnation:
            return False
        worker.last_heartbeat = time.monotonic()
        worker.num_requests = message.num_requests
        if not worker.stalled:
            return False
        worker.stalled = False
        log.warning("worker %d heartbeats again", worker.index)
        return True

    def find_stalled(self) -> None:
        """Mark up workers silent for two heartbeat intervals stalled (the caller makes sure no
        heartbeat waits unread in its inbox, so a busy event loop does not stall every worker)."""
        now = time.monotonic()
        for worker in self.workers:
            silent_s = now - worker.last_heartbeat
            if worker.is_up and not worker.stalled and silent_s > self.stalled_after_s:
                worker.stalled = True
                log.error(
                    "worker %d missed two heartbeats (silent %.1f s): not ready", worker.index, silent_s
                )

    @property
    def any_stalled(self) -> bool:
        return any(worker.stalled for worker in self.workers)

    def find_dead(self) -> list[int]:
        """Workers that exited or went silent since the last look (their processes are reaped)."""
        dead = []
        now = time.monotonic()
        for worker in self.workers:
            if worker.popen is None:
                continue
            exited = worker.popen.poll() is not None
            silent = worker.is_up and now - worker.last_heartbeat > self.heartbeat_timeout_s
            if exited or silent:
                if silent and not exited:
                    log.error(
                        "worker %d sent no heartbeat for %.0f s: killing it",
                        worker.index,
                        self.heartbeat_timeout_s,
                    )
                self._reap(worker)
                dead.append(worker.index)
        return dead

    def _reap(self, worker: WorkerProcess) -> None:
        popen, worker.popen = worker.popen, None
        if popen.poll() is None:
            popen.kill()
        code = popen.wait()
        if worker.is_up or not worker.boot_error:
            log.error("worker %d (pid %d) exited with code %s", worker.index, popen.pid, code)
        worker.endpoint, worker.stalled = "", False
        worker.num_requests = 0
        self.outboxes.set_endpoint(worker.index, "")
        self.broadcast_peers()

    def schedule_restart(self, index: int) -> None:
        """Restart at once after a crash; back off exponentially while the restarts fail to boot."""
        worker = self.workers[index]
        if worker.boot_error:
            worker.num_boot_failures += 1
        backoff_s = 0.0 if worker.num_boot_failures == 0 else 2.0**worker.num_boot_failures
        worker.restart_at = time.monotonic() + min(MAX_RESTART_BACKOFF_S, backoff_s)

    def due_restarts(self) -> list[int]:
        now = time.monotonic()
        return [
            w.index
            for w in self.workers
            if w.popen is None and w.restart_at is not None and w.restart_at <= now
        ]

    def ask_exit(self) -> None:
        for worker in self.workers:
            self.send(worker.index, m.Shutdown())

    def wait_exit(self, timeout_s: float = EXIT_WAIT_S) -> None:
        """Wait for the workers to leave (no sockets touched: safe in a helper thread); kill stragglers."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if worker.popen is None:
                continue
            try:
                worker.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.popen.kill()
                worker.popen.wait()
            worker.popen, worker.endpoint, worker.restart_at = None, "", None

    def close(self) -> None:
        self.outboxes.close()
        self._context.destroy(linger=0)

    def kill_all(self) -> None:
        for worker in self.workers:
            if worker.popen is not None and worker.popen.poll() is None:
                worker.popen.kill()
                worker.popen.wait()

    # ---- addressing ----------------------------------------------------------------------

    @property
    def all_up(self) -> bool:
        return all(worker.is_up for worker in self.workers)

    def is_up(self, index: int) -> bool:
        return self.workers[index].is_up

    def send(self, index: int, message: m.Message) -> bool:
        return self.outboxes.send(index, message)

    def broadcast(self, message: m.Message) -> None:
        for worker in self.workers:
            if worker.is_up:
                self.outboxes.send(worker.index, message)

    def broadcast_peers(self) -> None:
        self.peers_version += 1
        self.broadcast(m.Peers([worker.endpoint for worker in self.workers], self.peers_version))

    def pids(self) -> list[int | None]:
        return [worker.popen.pid if worker.popen is not None else None for worker in self.workers]
