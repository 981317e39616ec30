"""A worker's step loop: requests arrive at nodes, ride batched forwards, move on along their walk.

One round visits each local node with waiting requests, plans its batches (runtime/batch_planner.py:
one per batch key, capped by `max_batch_size` and `max_step_cost`) and runs one forward per batch.
A Loop stage keeps its requests in the node's queue until `check_stop`; new requests join between
steps. Messages (new walks, hand-offs, releases) are handled between forwards, which are the step
boundaries. Where a request goes next is the walk router's (runtime/walk_router.py); what the loop
reports about its forwards is the telemetry's (runtime/step_telemetry.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from mstar.engine.checked_compile import module_calls
from mstar.engine.memory import OUT_OF_MEMORY_KIND, is_out_of_memory, release_cached_memory
from mstar.errors import FailureKind
from mstar.graph import Loop, ModelSpec, Node, RequestState
from mstar.params import decode_params
from mstar.runtime import messages as m
from mstar.runtime.batch_planner import Candidate, NodeQueue, plan_batches
from mstar.runtime.node_calls import step_cost_of
from mstar.runtime.requests import RequestTable, WorkerRequest
from mstar.runtime.shm import SegmentStore
from mstar.runtime.step_telemetry import StepTelemetry
from mstar.runtime.tensors import import_tensors
from mstar.runtime.transport import Outboxes
from mstar.runtime.walk_router import WalkRouter

log = logging.getLogger("mstar.worker")


@dataclass
class NodeSlot:
    """A node and the requests waiting at it."""

    node: Node
    waiting: NodeQueue = field(default_factory=NodeQueue)


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
        self.store = store
        self.to_conductor = to_conductor
        self.peers = peers
        self.queues = {name: NodeSlot(node) for name, node in nodes.items()}
        self.table = RequestTable(on_release=self._release_nodes, released=released)
        self.router = WalkRouter(worker, spec, owner, store, to_conductor, peers, self._enter, self._fail)
        self.telemetry = StepTelemetry(worker, nodes, to_conductor)

    # ---- messages ------------------------------------------------------------------------

    def handle(self, message: m.Message) -> None:
        if isinstance(message, m.Peers):
            for index, endpoint in enumerate(message.endpoints):
                if index != self.worker:
                    self.peers.set_endpoint(index, endpoint)
        elif isinstance(message, m.Release):
            self.table.release(message.rid)
        elif isinstance(message, m.RunWalk | m.Handoff):
            self._on_request_message(message)

    def _on_request_message(self, message: m.RunWalk | m.Handoff) -> None:
        if self.table.was_released(message.rid):
            self.store.unlink_all(list(message.tensors))  # a straggler of an ended request
            return
        params = lambda: decode_params(message.params, self.spec.params_type)  # noqa: E731
        request = self.table.get_or_create(message.rid, message.request_id, params)
        if isinstance(message, m.RunWalk) and message.warmup:  # a peer's Handoff may come first
            request.state.warmup = True
        try:
            tensors = import_tensors(self.store, list(message.tensors))
        except Exception as exc:
            self._fail(request, f"could not read tensors: {exc}")
            return
        if isinstance(message, m.RunWalk):
            self.router.on_run_walk(request, message, tensors)
        else:
            self.router.on_handoff(request, message, tensors)

    def _enter(self, request: WorkerRequest, name: str) -> bool:
        slot = self.queues[name]
        try:
            slot.node.prepare(request.state)
        except Exception as exc:
            self._fail(request, f"{name}.prepare failed: {exc}", exc)
            return False
        request.prepared.add(name)
        slot.waiting.add(request.rid)
        return True

    # ---- steps ---------------------------------------------------------------------------

    def has_work(self) -> bool:
        """Whether a waiting request can ride a forward now (one that is not ready, e.g. its
        adapters loading, lets the worker idle until a message or the idle poll)."""
        return any(self._may_run(slot.node, rid) for slot in self.queues.values() for rid in slot.waiting)

    def _may_run(self, node: Node, rid: str) -> bool:
        try:
            return bool(node.ready(self.table.get(rid).state))
        except Exception:
            return True  # the next round's plan fails it, with the reason

    def run_round(self, at_step_boundary: Callable[[], None]) -> None:
        for slot in self.queues.values():
            if not slot.waiting:
                continue
            for rids in self._plan(slot):
                live = [
                    self.table.get(rid) for rid in rids if rid in slot.waiting
                ]  # a release may have come in
                if live:
                    self._run_batch(slot, live)
                at_step_boundary()

    def _plan(self, slot: NodeSlot) -> list[list[str]]:
        node = slot.node
        candidates = []
        for rid in slot.waiting:
            request = self.table.get(rid)
            try:
                ready = bool(node.ready(request.state))
            except Exception as exc:
                self._fail(request, f"{node.name}: {exc}")  # its adapters could not be loaded
                continue
            try:
                candidates.append(
                    Candidate(rid, node.batch_key(request.state), int(node.step_cost(request.state)), ready)
                )
            except Exception as exc:
                self._fail(request, f"{node.name}: batch_key/step_cost failed: {exc}", exc)
        return plan_batches(candidates, node.max_batch_size, node.max_step_cost)

    def _run_batch(self, slot: NodeSlot, batch: list[WorkerRequest]) -> None:
        node = slot.node
        states = [r.state for r in batch]
        cost = sum(step_cost_of(node, state) for state in states)
        with self.telemetry.around_forward(node) as done:
            failure = _run_forward(node, states)
            if failure is None:
                done(states, cost)
        if failure is not None:
            message, out_of_memory = failure
            kind = OUT_OF_MEMORY_KIND if out_of_memory else "error"
            for request in batch:  # only this batch: the others keep their state and go on
                self._fail(request, f"{node.name}.forward failed: {message}", kind=kind)
            if out_of_memory:
                release_cached_memory()  # the batch's tensors and the error's frames are gone now
            return
        for request in batch:
            if isinstance(self.router.stage(request), Loop):
                self._after_loop_step(slot, request)
            else:
                slot.waiting.discard(request.rid)
                self.router.stage_done(request)

    def report_step_times(self) -> None:
        self.telemetry.report_step_times()

    def _after_loop_step(self, slot: NodeSlot, request: WorkerRequest) -> None:
        node = slot.node
        try:
            progress = node.progress(request.state)
            stop = node.check_stop(request.state)
        except Exception as exc:
            self._fail(request, f"{node.name}: progress/check_stop failed: {exc}", exc)
            return
        if progress is not None:
            self.to_conductor(m.StepProgress(request.rid, int(progress[0]), int(progress[1])))
        if stop:
            slot.waiting.discard(request.rid)
            self.router.stage_done(request)
        else:
            slot.waiting.to_back(request.rid)  # round-robin under the caps

    # ---- endings -------------------------------------------------------------------------

    def _fail(
        self, request: WorkerRequest, message: str, exc: Exception | None = None, kind: FailureKind = "error"
    ) -> None:
        if exc is not None:
            log.error("request %s: %s", request.state.request_id, message, exc_info=exc)
        self.to_conductor(m.RequestError(request.rid, message, kind))
        self.table.release(request.rid)

    def _release_nodes(self, request: WorkerRequest) -> None:
        self.telemetry.forget(request.state.request_id)
        for slot in self.queues.values():
            slot.waiting.discard(request.rid)
        for name in request.prepared:
            try:
                self.queues[name].node.release(request.state)
            except Exception:
                log.exception("%s.release failed for %s", name, request.state.request_id)
            self.telemetry.report_events(self.queues[name].node)  # levels change without a step

    def release_all(self) -> None:
        for rid in list(self.table.rids()):
            self.table.release(rid)


def _run_forward(node: Node, batch: list[RequestState]) -> tuple[str, bool] | None:
    """None, or (error text, whether it was out of memory). The exception (and the activations
    its traceback holds) is dropped on return, before any cache is released."""
    try:
        with module_calls():  # a background compile's fx trace waits for it (engine.checked_compile)
            node.forward(batch)
    except Exception as exc:
        log.exception("%s.forward failed for %d request(s)", node.name, len(batch))
        return str(exc), is_out_of_memory(exc)
    return None
