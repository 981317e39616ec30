"""What the step loop reports about its forwards, as one listener it calls around each forward:

- step times: the device's (CUDA events, mstar.runtime.step_timer) or the host's, as StepStats;
  the loop runs at most MAX_STEPS_IN_FLIGHT steps ahead of the device (one: the host builds step
  N+1 while step N runs, and joins, leaves and aborts stay one step away);
- each node's recompiles and event counts (the prompt cache's hits), as increases, and its gauges
  (a KV pool's usage) when they change;
- the diagnostics switched on by environment variables: MSTAR_PROFILE_NODES (host-time profile of
  chosen nodes, runtime/node_profile.py) and MSTAR_TRACE_TENSORS (tensor hashes after every forward,
  runtime/tensor_trace.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from mstar.graph import Node, RequestState
from mstar.runtime import messages as m
from mstar.runtime.node_calls import event_counts_of, gauges_of, recompiles_of
from mstar.runtime.node_profile import NodeProfiler
from mstar.runtime.step_timer import StepTimer
from mstar.runtime.tensor_trace import TensorTracer

log = logging.getLogger("mstar.worker")
MAX_STEPS_IN_FLIGHT = 1


class StepTelemetry:
    def __init__(self, worker: int, nodes: dict[str, Node], to_conductor: Callable[[m.Message], None]):
        self.to_conductor = to_conductor
        self.step_timer = StepTimer()
        self.profiler = NodeProfiler.from_env(worker)
        self.tracer = TensorTracer.from_env(worker)
        self._recompiles = {name: recompiles_of(node) for name, node in nodes.items()}
        self._event_counts: dict[str, dict[str, int]] = {name: {} for name in nodes}  # as last reported
        self._gauges: dict[str, dict[str, float]] = {name: {} for name in nodes}  # as last reported

    @contextlib.contextmanager
    def around_forward(self, node: Node) -> Iterator[Callable[[list[RequestState], int], None]]:
        """Times the forward; the yielded `done(batch, cost)` records it (a failed forward is
        not recorded)."""
        timing = self.step_timer.start()
        started = time.perf_counter()

        def done(batch: list[RequestState], cost: int) -> None:
            host_s = time.perf_counter() - started
            warmup = all(request.warmup for request in batch)
            self.step_timer.stop(timing, (node.name, len(batch), cost, host_s, warmup))
            self.tracer.after_forward(node.name, batch)
            self.step_timer.bound_in_flight(MAX_STEPS_IN_FLIGHT)
            self.report_step_times()
            self._report_recompiles(node)
            self.report_events(node)

        with self.profiler.around(node.name):
            yield done

    def report_step_times(self) -> None:
        """StepStats for the steps whose device time is known by now (see StepTimer)."""
        for (name, batch_size, cost, host_s, warmup), duration_s in self.step_timer.collect():
            self.to_conductor(m.StepStats(name, batch_size, cost, duration_s, host_s, warmup))

    def forget(self, request_id: str) -> None:
        self.tracer.forget(request_id)

    def _report_recompiles(self, node: Node) -> None:
        count = recompiles_of(node)
        previous = self._recompiles.get(node.name, 0)
        if count > previous:
            log.warning("%s recompiled %d time(s) while serving", node.name, count - previous)
            self.to_conductor(m.Recompiles(node.name, count - previous))
            self._recompiles[node.name] = count

    def report_events(self, node: Node) -> None:
        """Increases of the node's event counts and its changed gauges (after a step, and after a
        release: levels such as a KV pool's usage change without a step)."""
        counts = event_counts_of(node)
        reported = self._event_counts.get(node.name, {})
        increments = {name: n - reported.get(name, 0) for name, n in counts.items()}
        increments = {name: n for name, n in increments.items() if n > 0}
        gauges = gauges_of(node)
        changed = gauges if gauges != self._gauges.get(node.name, {}) else {}
        if increments or changed:
            self.to_conductor(m.NodeEvents(node.name, increments, changed))
            self._event_counts[node.name], self._gauges[node.name] = counts, gauges
