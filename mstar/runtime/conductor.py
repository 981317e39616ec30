"""The conductor: admission, walk scheduling, deadlines, aborts and request endings.

Runs on the API process's event loop (every method is called from it). A request is admitted
when fewer than max_concurrent_requests run and every worker is up; otherwise it waits in a
bounded queue. Each walk goes to the worker owning its first node, told in advance where the
next walk starts so the walk's outputs go there directly. Every ending (done, error, abort,
timeout, worker death) goes through `_end`, which tells every worker to drop the request.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mstar.config import ServerConfig
from mstar.errors import FailureKind, InvalidParam, Overloaded
from mstar.graph import ModelSpec, stage_nodes
from mstar.params import RequestParams, encode_params
from mstar.runtime import messages as m
from mstar.runtime.events import Done, Failed, Piece, Progress
from mstar.runtime.handle import RequestHandle
from mstar.runtime.metrics import MetricsSink
from mstar.runtime.pool import WorkerPool
from mstar.runtime.shm import SegmentStore
from mstar.runtime.tensors import export_tensors, import_outputs

MAX_WALKS_PER_REQUEST = 256  # a model whose next_walk never returns None must not spin forever
MAX_REMEMBERED_ENDINGS = 4096
OUTCOMES = {"aborted": "aborted", "shutdown": "aborted", "timeout": "timeout"}

log = logging.getLogger("mstar.runtime")


@dataclass
class Job:
    rid: str
    handle: RequestHandle
    params: RequestParams
    inputs: dict[str, np.ndarray]
    submitted_at: float  # monotonic
    deadline: float  # monotonic
    admitted_at: float | None = None
    walk: str | None = None
    walk_started_at: float = 0.0  # monotonic, when the walk was dispatched
    next_walk: str | None = None
    num_walks: int = 0
    warmup: bool = False  # a boot warmup request (Runtime.start)
    workers: set[int] = field(default_factory=set)  # workers the current walk needs
    pieces: dict[str, list[np.ndarray]] = field(default_factory=dict)  # to join, for other callers
    inline_pieces: dict[str, list[Any]] = field(default_factory=dict)  # InlinePiece values, in order
    num_pieces: dict[str, int] = field(default_factory=dict)  # OutputPiece messages taken, per key


class Conductor:
    def __init__(
        self,
        config: ServerConfig,
        spec: ModelSpec,
        owner: dict[str, int],
        pool: WorkerPool,
        store: SegmentStore,
        metrics: MetricsSink,
    ):
        self.config = config
        self.spec = spec
        self.owner = owner
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.jobs: dict[str, Job] = {}  # rid -> job, waiting or running
        self.rids: dict[str, str] = {}  # request_id -> rid
        self.waiting: deque[str] = deque()
        self.running: set[str] = set()
        self.recently_ended: deque[str] = deque(maxlen=MAX_REMEMBERED_ENDINGS)
        self.accepting = True
        self._admitting = False
        self._next_rid = itertools.count(1)

    # ---- admission -----------------------------------------------------------------------

    def submit(
        self,
        params: RequestParams,
        inputs: dict[str, np.ndarray] | None,
        timeout_s: float | None,
        request_id: str,
        stream_outputs: frozenset[str] = frozenset(),
        warmup: bool = False,
    ) -> RequestHandle:
        if not self.accepting:
            raise Overloaded()
        if request_id in self.rids:
            raise InvalidParam("request_id", f"'{request_id}' is already in use")
        if not isinstance(params, self.spec.params_type):
            raise TypeError(
                f"params must be {self.spec.params_type.__name__} (spec.validate), got {type(params).__name__}"
            )
        is_full = len(self.running) >= self.config.max_concurrent_requests
        if is_full and len(self.waiting) >= self.config.max_queue_size:
            raise Overloaded()
        now = time.monotonic()
        timeout_s = timeout_s if timeout_s is not None else self.config.request_timeout_s
        rid = f"{next(self._next_rid):x}"
        handle = RequestHandle(request_id, stream_outputs)
        job = Job(rid, handle, params, dict(inputs or {}), now, now + timeout_s, warmup=warmup)
        self.jobs[rid] = job
        self.rids[request_id] = rid
        self.waiting.append(rid)
        self.admit_waiting()
        return job.handle

    def admit_waiting(self) -> None:
        if self._admitting:  # an ending inside _start re-enters here; the outer loop continues
            return
        self._admitting = True
        try:
            self._admit()
        finally:
            self._admitting = False

    def _admit(self) -> None:
        if not self.pool.all_up:
            if not self.config.worker_restart:
                self.fail_waiting("a worker is down and restarts are off", "worker_died")
            return
        if not self.pool.peers_settled or self.pool.any_stalled:
            return  # the last PeersKnown, or the stalled worker's next heartbeat, admits them
        while self.waiting and len(self.running) < self.config.max_concurrent_requests:
            job = self.jobs[self.waiting.popleft()]
            self.running.add(job.rid)
            job.admitted_at = time.monotonic()
            self.metrics.observe_queue_time(job.admitted_at - job.submitted_at)
            self._start(job)

    def _start(self, job: Job) -> None:
        try:
            first = self.spec.first_walk(job.params)
            refs = export_tensors(self.store, job.rid, job.inputs)
        except Exception as exc:
            log.exception("request %s could not start", job.handle.request_id)
            self._end(job, Failed(f"could not start: {exc}", "error"))
            return
        job.inputs = {}
        self._dispatch(job, first, previous_worker=None, tensors=refs)

    # ---- walks ---------------------------------------------------------------------------

    def _first_worker(self, walk: str) -> int:
        return self.owner[stage_nodes(self.spec.walks[walk].stages[0])[0]]

    def _dispatch(self, job: Job, walk: str, previous_worker: int | None, tensors: list[m.TensorRef] = ()):
        try:
            if walk not in self.spec.walks:
                raise ValueError(f"unknown walk '{walk}'")
            next_walk = self.spec.next_walk(job.params, walk)
            if next_walk is not None and next_walk not in self.spec.walks:
                raise ValueError(f"unknown next walk '{next_walk}'")
        except Exception as exc:
            self.store.unlink_all(list(tensors))
            log.exception("request %s: walk selection failed", job.handle.request_id)
            self._end(job, Failed(f"walk selection failed: {exc}", "error"))
            return
        job.num_walks += 1
        if job.num_walks > MAX_WALKS_PER_REQUEST:
            self._end(job, Failed(f"more than {MAX_WALKS_PER_REQUEST} walks", "error"))
            return
        worker = self._first_worker(walk)
        next_worker = m.CONDUCTOR if next_walk is None else self._first_worker(next_walk)
        job.walk, job.next_walk = walk, next_walk
        job.walk_started_at = time.monotonic()
        job.workers = {self.owner[name] for name in self.spec.walks[walk].nodes()}
        job.workers |= {w for w in (next_worker, previous_worker) if w is not None and w != m.CONDUCTOR}
        await_stash = previous_worker is not None and previous_worker != worker
        params = encode_params(job.params)
        run = m.RunWalk(
            job.rid, job.handle.request_id, params, walk, next_worker, list(tensors), await_stash, job.warmup
        )
        down = [w for w in sorted(job.workers) if not self.pool.is_up(w)]
        if down or not self.pool.send(worker, run):
            self.store.unlink_all(list(tensors))
            self._end(job, Failed(f"worker {down[0] if down else worker} is down", "worker_died"))

    # ---- messages from workers -----------------------------------------------------------

    def handle_message(self, message: m.Message) -> None:
        if isinstance(message, m.StepProgress):
            self._on_progress(message)
        elif isinstance(message, m.OutputPiece):
            self._on_output_piece(message)
        elif isinstance(message, m.InlinePiece):
            self._on_inline_piece(message)
        elif isinstance(message, m.WalkDone):
            self._on_walk_done(message)
        elif isinstance(message, m.RequestError):
            job = self.jobs.get(message.rid)
            if job is not None:
                log.error("request %s failed: %s", job.handle.request_id, message.message)
                self._end(job, Failed(message.message, message.kind))
        elif isinstance(message, m.StepStats):
            if message.warmup:  # may arrive after the warmup request ended (device times lag)
                return
            self.metrics.observe_step(
                message.node, message.batch_size, message.cost, message.duration_s, message.host_duration_s
            )
        elif isinstance(message, m.Recompiles):
            log.warning("node %s recompiled %d time(s) while serving", message.node, message.count)
            self.metrics.count_recompile(message.node, message.count)
        elif isinstance(message, m.NodeEvents):
            self.metrics.count_node_events(message.node, message.increments)
            if message.gauges:
                self.metrics.set_node_gauges(message.node, message.gauges)

    def _on_progress(self, message: m.StepProgress) -> None:
        job = self.jobs.get(message.rid)
        if job is None:
            return
        job.handle.push(Progress(message.step, message.total))

    def _on_walk_done(self, message: m.WalkDone) -> None:
        job = self.jobs.get(message.rid)
        if job is None or job.walk != message.walk:
            self.store.unlink_all(list(message.outputs))  # the request ended meanwhile
            return
        self.metrics.observe_walk(message.walk, time.monotonic() - job.walk_started_at)
        if job.next_walk is not None:
            self._dispatch(job, job.next_walk, previous_worker=message.worker)
            return
        try:
            outputs = import_outputs(self.store, list(message.outputs))
            if message.num_pieces != job.num_pieces:
                raise ValueError(f"{job.num_pieces} output pieces arrived, {message.num_pieces} were sent")
            outputs.update({key: np.concatenate(pieces) for key, pieces in job.pieces.items()})
            outputs.update(job.inline_pieces)  # lists of the values, in order
        except Exception as exc:
            log.exception("request %s: could not read outputs", job.handle.request_id)
            self._end(job, Failed(f"could not read outputs: {exc}", "error"))
            return
        job.pieces, job.inline_pieces = {}, {}
        self._end(job, Done(outputs))

    def _on_output_piece(self, message: m.OutputPiece) -> None:
        job = self.jobs.get(message.rid)
        if job is None:
            self.store.unlink(message.piece)  # the request ended meanwhile
            return
        key = message.piece.key
        try:
            if message.index != job.num_pieces.get(key, 0):
                self.store.unlink(message.piece)
                raise ValueError(f"piece {message.index} of '{key}' came out of order")
            piece = import_outputs(self.store, [message.piece])[key]
        except Exception as exc:
            log.exception("request %s: could not read an output piece", job.handle.request_id)
            self._end(job, Failed(f"could not read outputs: {exc}", "error"))
            return
        job.num_pieces[key] = message.index + 1
        if key in job.handle.stream_outputs:
            job.handle.push(Piece(key, message.index, piece))
        else:
            job.pieces.setdefault(key, []).append(piece)

    def _on_inline_piece(self, message: m.InlinePiece) -> None:
        job = self.jobs.get(message.rid)
        if job is None:
            return
        key = message.key
        if message.index != job.num_pieces.get(key, 0):
            log.error(
                "request %s: piece %d of '%s' came out of order", job.handle.request_id, message.index, key
            )
            self._end(job, Failed(f"piece {message.index} of '{key}' came out of order", "error"))
            return
        job.num_pieces[key] = message.index + 1
        if key in job.handle.stream_outputs:
            job.handle.push(Piece(key, message.index, message.value))
        else:
            job.inline_pieces.setdefault(key, []).append(message.value)

    # ---- endings -------------------------------------------------------------------------

    def abort(self, request_id: str) -> bool:
        rid = self.rids.get(request_id)
        if rid is None:
            return False
        self._end(self.jobs[rid], Failed("aborted", "aborted"))
        return True

    def check_deadlines(self) -> None:
        now = time.monotonic()
        for job in [job for job in self.jobs.values() if job.deadline <= now]:
            timeout_s = job.deadline - job.submitted_at
            self._end(job, Failed(f"request timed out after {timeout_s:g} s", "timeout"))

    def on_worker_down(self, index: int) -> None:
        for rid in list(self.running):
            job = self.jobs[rid]
            if index in job.workers:
                self._end(job, Failed(f"worker {index} died", "worker_died"))

    def fail_waiting(self, message: str, kind: FailureKind) -> None:
        while self.waiting:
            self._end(self.jobs[self.waiting[0]], Failed(message, kind))

    def fail_all(self, message: str, kind: FailureKind) -> None:
        for job in list(self.jobs.values()):
            self._end(job, Failed(message, kind))

    def _end(self, job: Job, event: Done | Failed) -> None:
        if self.jobs.pop(job.rid, None) is None:
            return
        self.rids.pop(job.handle.request_id, None)
        was_running = job.rid in self.running
        self.running.discard(job.rid)
        if not was_running:
            self.waiting.remove(job.rid)
        else:
            self.pool.broadcast(m.Release(job.rid))
        self.recently_ended.append(job.rid)
        outcome = "completed" if isinstance(event, Done) else OUTCOMES.get(event.kind, "failed")
        self.metrics.observe_request_end(outcome, time.monotonic() - job.submitted_at)
        job.handle.finish(event)
        if self.accepting:
            self.admit_waiting()

    # ---- introspection -------------------------------------------------------------------

    def active_rids(self) -> set[str]:
        return set(self.jobs)
