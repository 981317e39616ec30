"""A worker's step loop: requests arrive at nodes, ride batched forwards, move on along their walk.

One round visits each local node with waiting requests, groups them by `node.batch_key`, and runs
one forward per group (capped by `max_batch_size` and `max_step_cost`). A Loop stage keeps its
requests in the node's queue until `check_stop`; new requests join between steps. Messages (new
walks, hand-offs, releases) are handled between forwards, which are the step boundaries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mstar.engine.memory import OUT_OF_MEMORY_KIND, is_out_of_memory, release_cached_memory
from mstar.errors import FailureKind
from mstar.graph import Loop, ModelSpec, Node, Parallel, RequestState, Stage, stage_nodes
from mstar.params import decode_params, encode_params
from mstar.runtime import messages as m
from mstar.runtime.node_profile import NodeProfiler
from mstar.runtime.output_pieces import num_pieces_sent, piece_sender
from mstar.runtime.requests import RequestTable, WorkerRequest
from mstar.runtime.shm import SegmentStore
from mstar.runtime.step_timer import StepTimer
from mstar.runtime.tensor_trace import TensorTracer
from mstar.runtime.tensors import export_tensors, import_tensors
from mstar.runtime.transport import Outboxes

log = logging.getLogger("mstar.worker")
# Steps queued on the device beyond the one running: 1 lets the host build the next step while the
# current one runs (no device idle between steps) and keeps joins and aborts one step away.
MAX_STEPS_IN_FLIGHT = 1


@dataclass
class NodeQueue:
    node: Node
    waiting: dict[str, None] = field(default_factory=dict)  # rids in arrival (round-robin) order
    num_recompiles: int = 0
    event_counts: dict[str, int] = field(default_factory=dict)  # as last reported


class StepLoop:
    def __init__(
        self,
        worker: int,
        spec: ModelSpec,
        nodes: dict[str, Node],
        owner: dict[str, int],
        store: SegmentStore,
        to_conductor: Callable[[m.Message], None],
        peers: Outboxes,
        released: list[str] = (),
    ):
        self.worker = worker
        self.spec = spec
        self.owner = owner
        self.store = store
        self.to_conductor = to_conductor
        self.peers = peers
        self.queues = {
            name: NodeQueue(node, num_recompiles=_recompiles(node)) for name, node in nodes.items()
        }
        self.table = RequestTable(on_release=self._release_nodes, released=released)
        self.step_timer = StepTimer()
        self.profiler = NodeProfiler.from_env(worker)  # MSTAR_PROFILE_NODES: a diagnostic
        self.tracer = TensorTracer.from_env(worker)  # MSTAR_TRACE_TENSORS: a diagnostic

    # ---- messages ------------------------------------------------------------------------

    def handle(self, message: m.Message) -> None:
        if isinstance(message, m.Peers):
            for index, endpoint in enumerate(message.endpoints):
                if index != self.worker:
                    self.peers.set_endpoint(index, endpoint)
        elif isinstance(message, m.Release):
            self.table.release(message.rid)
        elif isinstance(message, m.RunWalk | m.Handoff):
            if self.table.was_released(message.rid):
                self.store.unlink_all(list(message.tensors))  # a straggler of an ended request
                return
            request = self.table.get_or_create(
                message.rid, message.request_id, lambda: decode_params(message.params, self.spec.params_type)
            )
            try:
                tensors = import_tensors(self.store, list(message.tensors))
            except Exception as exc:
                self._fail(request, f"could not read tensors: {exc}")
                return
            if isinstance(message, m.RunWalk):
                self._on_run_walk(request, message, tensors)
            else:
                self._on_handoff(request, message, tensors)

    def _on_run_walk(self, request: WorkerRequest, run: m.RunWalk, tensors: dict[str, Any]) -> None:
        request.state.tensors.update(tensors)
        if run.await_stash and not request.stash_arrived:
            request.pending_run = run
            return
        request.stash_arrived = False
        self._begin_walk(request, run.walk, run.next_worker)

    def _on_handoff(self, request: WorkerRequest, handoff: m.Handoff, tensors: dict[str, Any]) -> None:
        if handoff.part == "stash":
            request.state.tensors.update(tensors)
            run, request.pending_run = request.pending_run, None
            if run is None:
                request.stash_arrived = True
            else:
                self._begin_walk(request, run.walk, run.next_worker)
        elif handoff.part == "join":
            request.state.tensors.update(tensors)
            self._part_done(request)
        else:  # "stage" or "fork": the request's tensors now live here
            request.state.tensors = tensors
            request.walk, request.stage_index = handoff.walk, handoff.stage_index
            request.next_worker = handoff.next_worker
            if handoff.part == "fork":
                self._run_fork(request, handoff.source)
            else:
                self._start_stage(request)

    # ---- walks and stages ----------------------------------------------------------------

    def _begin_walk(self, request: WorkerRequest, walk: str, next_worker: int) -> None:
        if walk not in self.spec.walks:
            self._fail(request, f"unknown walk '{walk}'")
            return
        request.walk, request.stage_index, request.next_worker = walk, 0, next_worker
        self._start_stage(request)

    def _stage(self, request: WorkerRequest) -> Stage:
        return self.spec.walks[request.walk].stages[request.stage_index]

    def _start_stage(self, request: WorkerRequest) -> None:
        names = stage_nodes(self._stage(request))
        lead = self.owner[names[0]]
        if lead != self.worker:
            self._handoff(request, lead, "stage")
            return
        local = [name for name in names if self.owner[name] == self.worker]
        remote = sorted({self.owner[name] for name in names} - {self.worker})
        num_stages = len(self.spec.walks[request.walk].stages)
        request.state.emit_output = piece_sender(request, num_stages, self.store, self.to_conductor)
        request.parts_pending = len(local) + len(remote)
        for peer in remote:
            if not self._handoff(request, peer, "fork", move=False):
                return
        for name in local:
            if not self._enter(request, name):
                return

    def _run_fork(self, request: WorkerRequest, lead: int) -> None:
        local = [name for name in stage_nodes(self._stage(request)) if self.owner[name] == self.worker]
        request.fork_lead = lead
        request.state.emit_output = None  # pieces come from the lead, which counts them in WalkDone
        request.forked_inputs = dict(request.state.tensors)
        request.parts_pending = len(local)
        for name in local:
            if not self._enter(request, name):
                return

    def _enter(self, request: WorkerRequest, name: str) -> bool:
        queue = self.queues[name]
        try:
            queue.node.prepare(request.state)
        except Exception as exc:
            self._fail(request, f"{name}.prepare failed: {exc}", exc)
            return False
        request.prepared.add(name)
        queue.waiting[request.rid] = None
        return True

    def _stage_done(self, request: WorkerRequest) -> None:
        if isinstance(self._stage(request), Parallel):
            self._part_done(request)
        else:
            self._advance(request)

    def _part_done(self, request: WorkerRequest) -> None:
        request.parts_pending -= 1
        if request.parts_pending > 0:
            return
        if request.fork_lead is None:
            self._advance(request)
            return
        lead, request.fork_lead = request.fork_lead, None
        inputs, request.forked_inputs = request.forked_inputs, {}
        changed = {k: v for k, v in request.state.tensors.items() if inputs.get(k) is not v}
        request.state.tensors = changed
        self._handoff(request, lead, "join")

    def _advance(self, request: WorkerRequest) -> None:
        request.stage_index += 1
        if request.stage_index < len(self.spec.walks[request.walk].stages):
            self._start_stage(request)
        else:
            self._finish_walk(request)

    def _finish_walk(self, request: WorkerRequest) -> None:
        walk = self.spec.walks[request.walk]
        tensors = request.state.tensors
        num_pieces = num_pieces_sent(request.state.emit_output)
        request.state.emit_output = None
        if walk.outputs:
            missing = [key for key in walk.outputs if key not in tensors and key not in num_pieces]
            if missing:
                self._fail(request, f"walk '{walk.name}' ended without output(s) {missing}")
                return
            tensors = {key: tensors[key] for key in walk.outputs if key in tensors}
        request.state.tensors = {key: value for key, value in tensors.items() if key not in num_pieces}
        request.walk = ""
        if request.next_worker == m.CONDUCTOR:
            try:
                refs = export_tensors(self.store, request.rid, request.state.tensors)
            except Exception as exc:
                self._fail(request, f"could not export outputs: {exc}", exc)
                return
            request.state.tensors = {}
            self.to_conductor(m.WalkDone(request.rid, walk.name, self.worker, refs, num_pieces))
            return
        if request.next_worker != self.worker and not self._handoff(request, request.next_worker, "stash"):
            return
        self.to_conductor(m.WalkDone(request.rid, walk.name, self.worker))

    def _handoff(self, request: WorkerRequest, peer: int, part: m.HandoffPart, move: bool = True) -> bool:
        """Send the request's tensors to `peer`; False (and the request failed) when it cannot."""
        if not self.peers.is_up(peer):
            self._fail(request, f"worker {peer} is down", kind="worker_died")
            return False
        try:
            refs = export_tensors(self.store, request.rid, request.state.tensors)
        except Exception as exc:
            self._fail(request, f"could not export tensors: {exc}", exc)
            return False
        state = request.state
        handoff = m.Handoff(
            part, request.rid, state.request_id, encode_params(state.params), request.walk, request.stage_index,
            request.next_worker, self.worker, refs,
        )  # fmt: skip
        self.peers.send(peer, handoff)
        if move:
            state.tensors = {}
        return True

    # ---- steps ---------------------------------------------------------------------------

    def has_work(self) -> bool:
        return any(queue.waiting for queue in self.queues.values())

    def run_round(self, at_step_boundary: Callable[[], None]) -> None:
        for queue in self.queues.values():
            if not queue.waiting:
                continue
            for batch in self._plan_batches(queue):
                live = [r for r in batch if r.rid in queue.waiting]  # a release may have come in
                if live:
                    self._run_batch(queue, live)
                at_step_boundary()

    def _plan_batches(self, queue: NodeQueue) -> list[list[WorkerRequest]]:
        node = queue.node
        groups: dict[Any, list[WorkerRequest]] = {}
        costs: dict[Any, int] = {}
        for rid in list(queue.waiting):
            request = self.table.get(rid)
            try:
                key = node.batch_key(request.state)
                cost = int(node.step_cost(request.state))
            except Exception as exc:
                self._fail(request, f"{node.name}: batch_key/step_cost failed: {exc}", exc)
                continue
            group = groups.setdefault(key, [])
            if len(group) >= max(1, node.max_batch_size):
                continue
            if group and node.max_step_cost is not None and costs[key] + cost > node.max_step_cost:
                continue
            group.append(request)
            costs[key] = costs.get(key, 0) + cost
        return [group for group in groups.values() if group]

    def _run_batch(self, queue: NodeQueue, batch: list[WorkerRequest]) -> None:
        node = queue.node
        cost = sum(_safe_cost(node, r.state) for r in batch)
        timing = self.step_timer.start()
        host_started = time.perf_counter()
        with self.profiler.around(node.name):
            failure = _run_forward(node, batch)
        host_s = time.perf_counter() - host_started
        if failure is not None:
            message, out_of_memory = failure
            kind = OUT_OF_MEMORY_KIND if out_of_memory else "error"
            for request in batch:  # only this batch: the others keep their state and go on
                self._fail(request, f"{node.name}.forward failed: {message}", kind=kind)
            if out_of_memory:
                release_cached_memory()  # the batch's tensors and the error's frames are gone now
            return
        self.step_timer.stop(timing, (node.name, len(batch), cost, host_s))
        self.tracer.after_forward(node.name, [r.state for r in batch])
        self.step_timer.bound_in_flight(MAX_STEPS_IN_FLIGHT)
        self.report_step_times()
        self._report_recompiles(queue)
        self._report_events(queue)
        for request in batch:
            if isinstance(self._stage(request), Loop):
                self._after_loop_step(queue, request)
            else:
                queue.waiting.pop(request.rid, None)
                self._stage_done(request)

    def report_step_times(self) -> None:
        """StepStats for the steps whose device time is known by now (see StepTimer)."""
        for (name, batch_size, cost, host_s), duration_s in self.step_timer.collect():
            self.to_conductor(m.StepStats(name, batch_size, cost, duration_s, host_s))

    def _after_loop_step(self, queue: NodeQueue, request: WorkerRequest) -> None:
        node = queue.node
        try:
            progress = node.progress(request.state)
            stop = node.check_stop(request.state)
        except Exception as exc:
            self._fail(request, f"{node.name}: progress/check_stop failed: {exc}", exc)
            return
        if progress is not None:
            self.to_conductor(m.StepProgress(request.rid, int(progress[0]), int(progress[1])))
        queue.waiting.pop(request.rid, None)
        if stop:
            self._stage_done(request)
        else:
            queue.waiting[request.rid] = None  # back of the queue: round-robin under the caps

    def _report_recompiles(self, queue: NodeQueue) -> None:
        count = _recompiles(queue.node)
        if count > queue.num_recompiles:
            log.warning(
                "%s recompiled %d time(s) while serving", queue.node.name, count - queue.num_recompiles
            )
            self.to_conductor(m.Recompiles(queue.node.name, count - queue.num_recompiles))
            queue.num_recompiles = count

    def _report_events(self, queue: NodeQueue) -> None:
        counts = _event_counts(queue.node)
        increments = {name: n - queue.event_counts.get(name, 0) for name, n in counts.items()}
        increments = {name: n for name, n in increments.items() if n > 0}
        if increments:
            self.to_conductor(m.NodeEvents(queue.node.name, increments))
            queue.event_counts = counts

    # ---- endings -------------------------------------------------------------------------

    def _fail(
        self, request: WorkerRequest, message: str, exc: Exception | None = None, kind: FailureKind = "error"
    ) -> None:
        if exc is not None:
            log.error("request %s: %s", request.state.request_id, message, exc_info=exc)
        self.to_conductor(m.RequestError(request.rid, message, kind))
        self.table.release(request.rid)

    def _release_nodes(self, request: WorkerRequest) -> None:
        self.tracer.forget(request.state.request_id)
        for queue in self.queues.values():
            queue.waiting.pop(request.rid, None)
        for name in request.prepared:
            try:
                self.queues[name].node.release(request.state)
            except Exception:
                log.exception("%s.release failed for %s", name, request.state.request_id)

    def release_all(self) -> None:
        for rid in list(self.table.rids()):
            self.table.release(rid)


def _run_forward(node: Node, batch: list[WorkerRequest]) -> tuple[str, bool] | None:
    """None, or (error text, whether it was out of memory). The exception (and the activations
    its traceback holds) is dropped on return, before any cache is released."""
    try:
        node.forward([r.state for r in batch])
    except Exception as exc:
        log.exception("%s.forward failed for %d request(s)", node.name, len(batch))
        return str(exc), is_out_of_memory(exc)
    return None


def _recompiles(node: Node) -> int:
    try:
        return int(node.num_recompiles())
    except Exception:
        return 0


def _event_counts(node: Node) -> dict[str, int]:
    try:
        return {str(name): int(count) for name, count in node.event_counts().items()}
    except Exception:
        return {}


def _safe_cost(node: Node, state: RequestState) -> int:
    try:
        return int(node.step_cost(state))
    except Exception:
        return 0
