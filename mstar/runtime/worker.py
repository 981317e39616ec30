"""Worker process: `python -m mstar.runtime.worker --worker N`, boot description (JSON) on stdin.

Builds its node group with spec.build_nodes, warms the nodes up, reports Ready (or BootFailed with
the error text), then runs the step loop until Shutdown or until its parent process goes away.
torch is never imported here: a model's nodes import it when they are built.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import msgspec
import zmq

from mstar.config import ServerConfig
from mstar.engine.compile import use_compile_cache
from mstar.engine.memory import take_peak_allocated_bytes
from mstar.graph import BuildContext, ModelSpec, Node
from mstar.models.registry import get_model_spec
from mstar.runtime import messages as m
from mstar.runtime.shm import SegmentStore
from mstar.runtime.step_loop import StepLoop
from mstar.runtime.transport import Outboxes, StepOutbox, bind_inbox, connect_push, receive, send
from mstar.runtime.waker import Waker

IDLE_POLL_MS = 100  # the poll returns as soon as a message or a wake comes: this only paces idle checks
FLUSH_ON_EXIT_MS = 1000
# sent by the hundred per step (a text model's token pieces): they leave together at the boundary
COALESCED = (m.InlinePiece, m.StepProgress, m.StepStats, m.NodeEvents)


def is_first_piece(message: m.Message) -> bool:
    """A request's first output piece (its first tokens) leaves at once: the time to it is what
    its client waits on, and there is one per request, not one per step."""
    return isinstance(message, m.InlinePiece) and message.index == 0


log = logging.getLogger("mstar.worker")


def build_group(
    boot: m.WorkerBoot, progress: Callable[[str, int, int], None], wake: Callable[[], None] | None = None
) -> tuple[ServerConfig, ModelSpec, dict[str, Node], dict[str, int]]:
    config = ServerConfig.model_validate_json(boot.config_json)
    spec = get_model_spec(boot.spec_path)
    groups = config.placement(spec.node_names)
    owner = {name: index for index, group in enumerate(groups) for name in group.nodes}
    group = groups[boot.worker]
    use_compile_cache(config.compile_cache_dir)
    use_device(group.device)
    context = BuildContext(
        config=config,
        device=group.device,
        node_names=tuple(group.nodes),
        model_path=config.model_path,
        random_weights=config.random_weights,
        progress=progress,
        wake=wake,
    )
    built = _timed_build_nodes(spec, context)
    missing = [name for name in group.nodes if name not in built]
    if missing:
        raise RuntimeError(f"{type(spec).__name__}.build_nodes did not build node(s) {missing}")
    nodes = {name: built[name] for name in group.nodes}
    for name, node in nodes.items():
        node.name = node.name or name
        progress(f"warmup {node.name}", 0, 1)  # a bar from the start: compiles can take minutes
        _timed_warmup(node)
        progress(f"warmup {node.name}", 1, 1)
    return config, spec, nodes, owner


def use_device(device: str) -> None:
    """Make a group's GPU this process's current one ("cuda:1" -> 1): streams, events and graphs
    taken without a device (the step timer's, say) then belong to it, and no CUDA context is
    opened on GPU 0 as well. Plain "cuda" and the CPU keep the default."""
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))


def _timed_build_nodes(spec: ModelSpec, context: BuildContext) -> dict[str, Node]:
    """Building loads the weights: the boot log says how much of the boot that took."""
    started = time.monotonic()
    built = spec.build_nodes(context)
    log.info(
        "built node(s) %s on %s in %.1f s",
        ",".join(context.node_names),
        context.device,
        time.monotonic() - started,
    )
    return built


def _timed_warmup(node: Node) -> None:
    """Node warmups compile kernels and can dominate the boot: log each one's share."""
    started = time.monotonic()
    node.warmup()
    log.info("node %s warmed up in %.1f s", node.name, time.monotonic() - started)


class Worker:
    def __init__(self, boot: m.WorkerBoot, parent_pid: int | None = None):
        """`parent_pid`: the API process, as it said when it spawned us (os.getppid() by now may be
        1 already: a parent that died while we imported would go unnoticed)."""
        self.boot = boot
        self.context = zmq.Context()
        self.inbox, self.endpoint = bind_inbox(self.context, boot.bind_endpoint)
        self.conductor = connect_push(self.context, boot.conductor_endpoint)
        self.outbox = StepOutbox(self.conductor, COALESCED, is_first_piece)  # the step loop's messages
        self.peers = Outboxes(self.context)
        self.store = SegmentStore(boot.segment_dir, boot.segment_prefix)
        self.waker = Waker()  # nodes wake the idle poll when a request turns ready off the loop
        self.parent_pid = os.getppid() if parent_pid is None else parent_pid
        self.heartbeat_interval_s = ServerConfig.model_validate_json(boot.config_json).heartbeat_interval_s
        self.loop: StepLoop | None = None
        self.stopping = False
        self._boot_progress_lock = threading.Lock()
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)

    def boot_nodes(self) -> bool:
        try:
            _, spec, nodes, owner = build_group(self.boot, self._boot_progress, self.waker.wake)
        except Exception as exc:
            log.exception("worker %d failed to boot", self.boot.worker)
            send(
                self.conductor,
                m.BootFailed(self.boot.worker, self.boot.incarnation, f"{type(exc).__name__}: {exc}"),
            )
            return False
        self.loop = StepLoop(
            self.boot.worker,
            spec,
            nodes,
            owner,
            self.store,
            self._to_conductor,
            self.peers,
            self.boot.released,
        )
        send(self.conductor, m.Ready(self.boot.worker, self.boot.incarnation, self.endpoint))
        return True

    def _to_conductor(self, message: m.Message) -> None:
        self.outbox.send(message)

    def _boot_progress(self, label: str, done: int, total: int) -> None:
        """BuildContext.progress: loaders may call it from their own threads, hence the lock."""
        log.debug("%s: %d/%d", label, done, total)
        with self._boot_progress_lock:
            send(self.conductor, m.BootProgress(self.boot.worker, str(label), int(done), int(total)))

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        poller.register(self.waker.fileno(), zmq.POLLIN)
        while not self.stopping and self._parent_alive():
            self.waker.clear()  # a wake before this is seen by has_work; a later one ends the poll
            self._drain(poller, 0 if self.loop.has_work() else IDLE_POLL_MS)
            if not self.stopping:
                self.loop.run_round(lambda: self._drain(poller, 0))
                self.loop.report_step_times()  # steps the device finished while the loop idled
        self.loop.release_all()
        self.outbox.flush()

    def _drain(self, poller: zmq.Poller, timeout_ms: int) -> None:
        """At a step boundary: send what the step queued, then handle what came in (waiting up to
        timeout_ms for it), then send the answers."""
        self.outbox.flush()
        if not poller.poll(timeout_ms):
            return
        while not self.stopping:
            try:
                frames = receive(self.inbox, zmq.NOBLOCK)
            except zmq.Again:
                break
            for data in frames:
                self._handle_frame(data)
        self.outbox.flush()

    def _handle_frame(self, data: bytes) -> None:
        try:
            message = m.decode(data)
        except msgspec.DecodeError:
            log.error("dropped an undecodable message (%d bytes)", len(data))
            return
        if isinstance(message, m.Shutdown):
            self.stopping = True
        elif not self.stopping:
            self._handle(message)

    def _handle(self, message: m.Message) -> None:
        """A bug while handling one request's message fails that request, not the worker."""
        try:
            self.loop.handle(message)
            if isinstance(message, m.Peers):
                self._to_conductor(m.PeersKnown(self.boot.worker, self.boot.incarnation, message.version))
        except Exception as exc:
            log.exception("failed to handle %s", type(message).__name__)
            rid = getattr(message, "rid", None)
            if rid is not None:
                self.loop.table.release(rid)
                self._to_conductor(m.RequestError(rid, f"worker error: {exc}"))

    def _parent_alive(self) -> bool:
        return os.getppid() == self.parent_pid

    def start_heartbeat(self) -> None:
        self._heartbeat_thread.start()

    def _heartbeat(self) -> None:
        socket = connect_push(self.context, self.boot.conductor_endpoint)
        while not self._heartbeat_stop.is_set():
            if not self._parent_alive():
                os._exit(1)  # orphaned: the API process is gone, nobody will shut us down
            num_requests = len(self.loop.table) if self.loop is not None else 0
            send(
                socket,
                m.Heartbeat(
                    self.boot.worker, self.boot.incarnation, num_requests, self._peak_allocated_bytes()
                ),
            )
            self._heartbeat_stop.wait(self.heartbeat_interval_s)
        socket.close(linger=0)

    def _peak_allocated_bytes(self) -> int:
        """0 until the nodes are built: torch may still be importing on the main thread (a half
        imported module). A failed read never stops the heartbeat: missing beats mark us dead."""
        if self.loop is None:
            return 0
        try:
            return take_peak_allocated_bytes()
        except Exception:
            log.debug("reading the peak allocated GPU memory failed", exc_info=True)
            return 0

    def close(self) -> None:
        """Stop the heartbeat, flush what is queued for the conductor (bounded), close everything."""
        self.stopping = True
        self._heartbeat_stop.set()
        if self._heartbeat_thread.is_alive():
            self._heartbeat_thread.join(timeout=2.0)
        self.outbox.flush()
        self.peers.close()
        self.inbox.close(linger=0)
        self.conductor.close(linger=FLUSH_ON_EXIT_MS)
        self.context.term()
        self.waker.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mstar.runtime.worker")
    parser.add_argument("--worker", type=int, required=True, help="worker index (also in the boot JSON)")
    parser.add_argument("--parent-pid", type=int, help="the API process (default: our parent now)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("MSTAR_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s worker{args.worker} %(levelname)s %(name)s: %(message)s",
    )
    # The API process stops its workers (Shutdown, then SIGKILL; they also leave when it is gone).
    # A SIGTERM sent to every process of the service (systemd's default KillMode) must not end a
    # worker under the requests the API process is still draining.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    boot = msgspec.json.decode(sys.stdin.buffer.read(), type=m.WorkerBoot)
    worker = Worker(boot, args.parent_pid)
    worker.start_heartbeat()
    try:
        if not worker.boot_nodes():
            return 1
        worker.serve()
        return 0
    finally:
        worker.close()


if __name__ == "__main__":
    exit_code = main()
    logging.shutdown()
    os._exit(exit_code)  # skip interpreter teardown of model libraries; everything is closed
