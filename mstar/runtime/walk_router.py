"""Where a worker's requests go between steps: the stages of their walks, across workers.

A walk's stage is a node, a Loop(node) or a Parallel(nodes). The router starts each stage where its
first node lives (a "stage" hand-off when that is another worker), enters the request at this
worker's nodes of it (a Parallel stage forks to the other workers, which send "join" back to the
owner of its first node), and when the walk ends keeps only the walk's declared outputs and sends
them on: to the conductor (the final walk), or to the worker of the next walk ("stash", kept until
that walk's RunWalk arrives). Tensors move by `Handoff` through shared memory.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mstar.graph import ModelSpec, Parallel, Stage, stage_nodes
from mstar.params import encode_params
from mstar.runtime import messages as m
from mstar.runtime.output_pieces import num_pieces_sent, piece_sender
from mstar.runtime.requests import WorkerRequest
from mstar.runtime.shm import SegmentStore
from mstar.runtime.tensors import export_tensors
from mstar.runtime.transport import Outboxes

log = logging.getLogger("mstar.worker")


class WalkRouter:
    def __init__(
        self,
        worker: int,
        spec: ModelSpec,
        owner: dict[str, int],
        store: SegmentStore,
        to_conductor: Callable[[m.Message], None],
        peers: Outboxes,
        enter: Callable[[WorkerRequest, str], bool],
        fail: Callable[..., None],
    ):
        self.worker = worker
        self.spec = spec
        self.owner = owner
        self.store = store
        self.to_conductor = to_conductor
        self.peers = peers
        self.enter = enter  # (request, node name) -> False when the request failed to enter
        self.fail = fail  # (request, message, exc=None, kind="error")

    # ---- arrivals ------------------------------------------------------------------------

    def on_run_walk(self, request: WorkerRequest, run: m.RunWalk, tensors: dict[str, Any]) -> None:
        request.state.tensors.update(tensors)
        if run.await_stash and not request.stash_arrived:
            request.pending_run = run
            return
        request.stash_arrived = False
        self._begin_walk(request, run.walk, run.next_worker)

    def on_handoff(self, request: WorkerRequest, handoff: m.Handoff, tensors: dict[str, Any]) -> None:
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

    # ---- stages --------------------------------------------------------------------------

    def stage(self, request: WorkerRequest) -> Stage:
        return self.spec.walks[request.walk].stages[request.stage_index]

    def stage_done(self, request: WorkerRequest) -> None:
        """One of this worker's nodes finished the request's current stage."""
        if isinstance(self.stage(request), Parallel):
            self._part_done(request)
        else:
            self._advance(request)

    def _begin_walk(self, request: WorkerRequest, walk: str, next_worker: int) -> None:
        if walk not in self.spec.walks:
            self.fail(request, f"unknown walk '{walk}'")
            return
        request.walk, request.stage_index, request.next_worker = walk, 0, next_worker
        self._start_stage(request)

    def _start_stage(self, request: WorkerRequest) -> None:
        names = stage_nodes(self.stage(request))
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
            if not self.enter(request, name):
                return

    def _run_fork(self, request: WorkerRequest, lead: int) -> None:
        local = [name for name in stage_nodes(self.stage(request)) if self.owner[name] == self.worker]
        request.fork_lead = lead
        request.state.emit_output = None  # pieces come from the lead, which counts them in WalkDone
        request.forked_inputs = dict(request.state.tensors)
        request.parts_pending = len(local)
        for name in local:
            if not self.enter(request, name):
                return

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
                self.fail(request, f"walk '{walk.name}' ended without output(s) {missing}")
                return
            tensors = {key: tensors[key] for key in walk.outputs if key in tensors}
        request.state.tensors = {key: value for key, value in tensors.items() if key not in num_pieces}
        request.walk = ""
        if request.next_worker == m.CONDUCTOR:
            try:
                refs = export_tensors(self.store, request.rid, request.state.tensors)
            except Exception as exc:
                self.fail(request, f"could not export outputs: {exc}", exc)
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
            self.fail(request, f"worker {peer} is down", kind="worker_died")
            return False
        try:
            refs = export_tensors(self.store, request.rid, request.state.tensors)
        except Exception as exc:
            self.fail(request, f"could not export tensors: {exc}", exc)
            return False
        state = request.state
        handoff = m.Handoff(
            part, request.rid, state.request_id, encode_params(state.params), request.walk,
            request.stage_index, request.next_worker, self.worker, refs,
        )  # fmt: skip
        self.peers.send(peer, handoff)
        if move:
            state.tensors = {}
        return True
