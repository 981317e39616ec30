"""Runtime: what the API holds. Starts the worker processes, runs the conductor on the event loop,
watches workers (restart, deadlines, leaked segments) and shuts everything down cleanly."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import secrets
import shutil
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from mstar.config import ServerConfig
from mstar.errors import InvalidParam
from mstar.graph import ModelSpec
from mstar.models.registry import spec_path
from mstar.params import RequestParams
from mstar.runtime import messages as m
from mstar.runtime.conductor import Conductor
from mstar.runtime.events import Done, Failed, Piece, Progress
from mstar.runtime.handle import RequestHandle
from mstar.runtime.metrics import MetricsSink, NullMetrics
from mstar.runtime.pool import WorkerPool
from mstar.runtime.shm import SegmentStore, default_segment_dir
from mstar.runtime.tensors import NUMERIC_KINDS
from mstar.runtime.transport import bind_endpoint, bind_inbox, make_run_dir

__all__ = ["Done", "Failed", "Piece", "Progress", "RequestHandle", "Runtime", "RuntimeStats"]

MONITOR_INTERVAL_S = 0.1
SWEEP_INTERVAL_S = 2.0
SEGMENT_GRACE_S = 5.0  # a segment of an ended request older than this is a leftover
BOOT_EXIT_GRACE_S = 0.5  # time for a BootFailed message to arrive after its worker exited

log = logging.getLogger("mstar.runtime")


@dataclass(frozen=True)
class RuntimeStats:
    num_running: int
    num_waiting: int
    num_worker_requests: tuple[int, ...] = ()  # requests each worker holds state for (heartbeats)


class Runtime:
    def __init__(self, config: ServerConfig, spec: ModelSpec, metrics: MetricsSink | None = None):
        self.config = config
        self.spec = spec
        self.metrics = metrics or NullMetrics()
        self.groups = config.placement(spec.node_names)
        if config.offload_text_encoder and not spec.streams_text_encoder:
            raise ValueError(f"offload_text_encoder: {spec.name} cannot stream its text encoder's weights")
        self.owner = {name: index for index, group in enumerate(self.groups) for name in group.nodes}
        _check_walks(spec)
        self._pool: WorkerPool | None = None
        self._conductor: Conductor | None = None
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._warmed = False
        self._closing = False  # draining: no new requests, no worker restarts
        self._shut_down = False
        self._on_boot_progress: Callable[[str, int, int], None] | None = None

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self, on_progress: Callable[[str, int, int], None] | None = None) -> None:
        """Boot every worker; `on_progress(label, done, total)` gets their load and warmup progress."""
        if self._pool is not None:
            raise RuntimeError("Runtime.start() was already called")
        self._run_dir = make_run_dir()
        prefix = f"mstar-{os.getpid():x}{secrets.token_hex(4)}-"
        self._store = SegmentStore(default_segment_dir(self._run_dir), prefix)
        self._context = zmq.asyncio.Context()
        self._inbox, endpoint = bind_inbox(
            self._context, bind_endpoint(self.config.transport, self._run_dir, "c")
        )
        template = m.WorkerBoot(
            self.config.model_dump_json(), spec_path(self.spec), 0, 0, "", endpoint,
            str(self._store.directory), prefix,
        )  # fmt: skip
        self._pool = WorkerPool(
            self.groups, template, self.config.transport, self._run_dir,
            self.config.heartbeat_interval_s, self.config.heartbeat_timeout_s,
        )  # fmt: skip
        self._conductor = Conductor(self.config, self.spec, self.owner, self._pool, self._store, self.metrics)
        self._on_boot_progress = on_progress
        self._tasks = [asyncio.create_task(self._receive())]
        atexit.register(self._cleanup_at_exit)
        boot_started = time.monotonic()
        try:
            workers_up_s = await self._spawn_workers()
            self._tasks.append(asyncio.create_task(self._monitor()))
            self._started = True
            num_warmup_requests = await self._run_warmup_requests()
        except BaseException:
            await self._teardown()
            raise
        self._warmed = True
        _log_boot_times(workers_up_s, num_warmup_requests, time.monotonic() - boot_started)

    async def _spawn_workers(self) -> float:
        """Spawn every worker, wait until all built and warmed up their nodes; returns the seconds."""
        started = time.monotonic()
        for index in range(len(self.groups)):
            self._pool.spawn(index)
        await self._wait_until_up()
        workers_up_s = time.monotonic() - started
        # logged now, not only in the summary, so a hanging warmup request still shows this part
        log.info("boot: %d worker(s) up in %.1f s", len(self.groups), workers_up_s)
        return workers_up_s

    async def _run_warmup_requests(self) -> int:
        """Each warmup request goes through the whole walk, one after another; kept out of /metrics.
        Returns how many ran."""
        requests = self.spec.warmup_requests(self.config)
        conductor_metrics, self._conductor.metrics = self._conductor.metrics, NullMetrics()
        try:
            for index, params in enumerate(requests):
                started = time.monotonic()
                self._report_progress("warmup requests", index, len(requests))
                inputs = self.spec.warmup_inputs(params)
                handle = self._conductor.submit(
                    params, inputs, self.config.request_timeout_s, f"warmup-{index}", warmup=True
                )
                try:
                    await self._follow_warmup_request(handle, f"warmup request {index + 1}")
                except Exception as error:
                    raise RuntimeError(f"warmup request {index} ({params}) failed: {error}") from error
                log.info(
                    "warmup request %d/%d done in %.1f s",
                    index + 1,
                    len(requests),
                    time.monotonic() - started,
                )
                self._report_progress("warmup requests", index + 1, len(requests))
        finally:
            self._conductor.metrics = conductor_metrics
        return len(requests)

    async def _follow_warmup_request(self, handle: RequestHandle, label: str) -> None:
        """Its denoise steps feed a live bar (`label`, step, total) until it ends; raises if it failed."""
        async for event in handle.events():
            if isinstance(event, Progress):
                self._report_progress(label, event.step, event.total)
        await handle.result()

    async def _wait_until_up(self) -> None:
        while not (self._pool.all_up and self._pool.peers_settled):
            for worker in self._pool.workers:
                if worker.boot_error:
                    raise RuntimeError(self._boot_failure(worker.index, worker.boot_error))
            for index in self._pool.find_dead():
                await asyncio.sleep(BOOT_EXIT_GRACE_S)  # its BootFailed may still be in the socket
                error = self._pool.workers[index].boot_error or "exited before it was ready"
                raise RuntimeError(self._boot_failure(index, error))
            await asyncio.sleep(0.02)

    def _boot_failure(self, index: int, error: str) -> str:
        nodes = ",".join(self.groups[index].nodes)
        return f"worker {index} ({nodes} on {self.groups[index].device}) failed to boot: {error}"

    async def drain(self, timeout_s: float) -> None:
        """Take no more requests (`ready` turns False), fail the waiting ones, give the running ones
        up to timeout_s to finish, then fail them (kind "shutdown"). The workers keep running."""
        if self._conductor is None:
            return
        self._closing = True
        conductor = self._conductor
        conductor.accepting = False
        conductor.fail_waiting("server is shutting down", "shutdown")
        deadline = time.monotonic() + timeout_s
        while conductor.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        conductor.fail_all("server shut down before the request finished", "shutdown")

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """drain(timeout_s), then stop the workers and remove the sockets and segments."""
        if self._pool is None or self._shut_down:
            return
        self._shut_down = True
        await self.drain(timeout_s)
        await self._teardown()

    async def _teardown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        atexit.unregister(self._cleanup_at_exit)
        if self._pool is not None:
            self._pool.ask_exit()
            await asyncio.to_thread(self._pool.wait_exit)
            self._pool.close()
        if getattr(self, "_inbox", None) is not None:
            self._inbox.close(linger=0)
            self._context.term()
        self._store.sweep()
        shutil.rmtree(self._run_dir, ignore_errors=True)
        self._started = False

    def _cleanup_at_exit(self) -> None:
        """The process exits without shutdown(): leave no worker, segment or socket file behind."""
        self._pool.kill_all()
        self._store.sweep()
        shutil.rmtree(self._run_dir, ignore_errors=True)

    @property
    def ready(self) -> bool:
        pool = self._pool
        return self._started and self._warmed and not self._closing and pool.all_up and not pool.any_stalled

    # ---- requests ------------------------------------------------------------------------

    def submit(
        self,
        params: RequestParams,
        inputs: dict[str, np.ndarray] | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
        stream_outputs: Collection[str] = (),
    ) -> RequestHandle:
        """`stream_outputs`: outputs to take as Piece events where the model sends them in pieces
        (a clip's frames as they are decoded); the handle's Done then lacks them."""
        if self._conductor is None:
            raise RuntimeError("Runtime.start() has not been awaited")
        _check_inputs(inputs)
        request_id = request_id or uuid.uuid4().hex
        return self._conductor.submit(params, inputs, timeout_s, request_id, frozenset(stream_outputs))

    def abort(self, request_id: str) -> bool:
        return self._conductor is not None and self._conductor.abort(request_id)

    def stats(self) -> RuntimeStats:
        if self._conductor is None:
            return RuntimeStats(0, 0)
        held = tuple(worker.num_requests for worker in self._pool.workers)
        return RuntimeStats(len(self._conductor.running), len(self._conductor.waiting), held)

    def worker_pids(self) -> list[int | None]:
        """Process ids by worker index (None while one is down); for operators and tests."""
        return self._pool.pids() if self._pool is not None else []

    # ---- background tasks ----------------------------------------------------------------

    async def _receive(self) -> None:
        while True:
            for data in await self._inbox.recv_multipart():  # a worker's step: many messages
                try:
                    self._on_message(m.decode(data))
                except msgspec.DecodeError:
                    log.error("dropped an undecodable message (%d bytes)", len(data))
                except Exception:
                    log.exception("failed to handle a worker message")

    def _on_message(self, message: m.Message) -> None:
        if isinstance(message, m.Heartbeat):
            if self._pool.on_heartbeat(message) and self._started:
                self._conductor.admit_waiting()
            self.metrics.observe_gpu_memory(message.worker, message.gpu_peak_allocated_bytes)
        elif isinstance(message, m.Ready):
            self._pool.on_ready(message)
        elif isinstance(message, m.PeersKnown):
            if self._pool.on_peers_known(message) and self._started:
                self._conductor.admit_waiting()
        elif isinstance(message, m.BootProgress):
            self._report_boot_progress(message)
        elif isinstance(message, m.BootFailed):
            if self._pool.on_boot_failed(message):
                log.error("%s", self._boot_failure(message.worker, message.error))
        else:
            self._conductor.handle_message(message)

    def _report_boot_progress(self, message: m.BootProgress) -> None:
        label = message.label if len(self.groups) == 1 else f"worker {message.worker}: {message.label}"
        self._report_progress(label, message.done, message.total)

    def _report_progress(self, label: str, done: int, total: int) -> None:
        if self._on_boot_progress is None:
            return
        try:
            self._on_boot_progress(label, done, total)
        except Exception:
            log.exception("boot progress callback failed")

    async def _monitor(self) -> None:
        next_sweep = time.monotonic() + SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(MONITOR_INTERVAL_S)
            try:
                self._watch_workers()
                self._conductor.check_deadlines()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_INTERVAL_S
                    self._store.sweep(keep_rids=self._conductor.active_rids(), min_age_s=SEGMENT_GRACE_S)
            except Exception:
                log.exception("runtime monitor iteration failed")

    def _watch_workers(self) -> None:
        if not self._inbox.get(zmq.EVENTS) & zmq.POLLIN:  # else heartbeats may wait unread there
            self._pool.find_stalled()
        for index in self._pool.find_dead():
            self._conductor.on_worker_down(index)
            if self.config.worker_restart and not self._closing:
                self._pool.schedule_restart(index)
            else:
                self._conductor.admit_waiting()  # fails the waiting requests: nothing will serve them
        for index in self._pool.due_restarts():
            log.info("restarting worker %d", index)
            self._pool.spawn(index, released=list(self._conductor.recently_ended))


def _check_inputs(inputs: dict[str, np.ndarray] | None) -> None:
    for key, value in (inputs or {}).items():
        if not isinstance(value, np.ndarray) or value.dtype.kind not in NUMERIC_KINDS:
            raise InvalidParam(f"inputs.{key}", "must be a numeric numpy array")


def _check_walks(spec: ModelSpec) -> None:
    known = set(spec.node_names)
    for name, walk in spec.walks.items():
        if not walk.stages:
            raise ValueError(f"walk '{name}' has no stages")
        unknown = [node for node in walk.nodes() if node not in known]
        if unknown:
            raise ValueError(
                f"walk '{name}' uses unknown node(s) {unknown}; model has {list(spec.node_names)}"
            )


def _log_boot_times(workers_up_s: float, num_warmup_requests: int, ready_s: float) -> None:
    """One line that splits the boot: slow weights/compiles (workers up) vs slow warmup requests."""
    log.info(
        "boot: workers up in %.1f s, %d warmup request(s) in %.1f s, ready after %.1f s",
        workers_up_s,
        num_warmup_requests,
        ready_s - workers_up_s,
        ready_s,
    )
