"""Where the runtime reports what it measures. The API implements this with prometheus-client."""

from __future__ import annotations

from typing import Protocol


class MetricsSink(Protocol):
    def observe_queue_time(self, seconds: float) -> None: ...

    def observe_step(
        self, node: str, batch_size: int, cost: int, duration_s: float, host_duration_s: float = 0.0
    ) -> None: ...

    def observe_request_end(self, outcome: str, latency_s: float) -> None:
        """outcome: completed | failed | aborted | timeout"""

    def observe_walk(self, walk: str, seconds: float) -> None:
        """A walk's time from its dispatch to its WalkDone, in the conductor."""

    def count_recompile(self, node: str, count: int) -> None: ...

    def count_node_events(self, node: str, increments: dict[str, int]) -> None: ...

    def set_node_gauges(self, node: str, gauges: dict[str, float]) -> None:
        """A node's current levels (Node.gauges), e.g. the share of the KV pool in use."""

    def observe_gpu_memory(self, worker: int, peak_allocated_bytes: int) -> None:
        """The worker's peak allocated GPU bytes over its last heartbeat interval."""


class NullMetrics:
    """Used when no sink is given."""

    def observe_queue_time(self, seconds: float) -> None:
        pass

    def observe_step(
        self, node: str, batch_size: int, cost: int, duration_s: float, host_duration_s: float = 0.0
    ) -> None:
        pass

    def observe_request_end(self, outcome: str, latency_s: float) -> None:
        pass

    def observe_walk(self, walk: str, seconds: float) -> None:
        pass

    def count_recompile(self, node: str, count: int) -> None:
        pass

    def count_node_events(self, node: str, increments: dict[str, int]) -> None:
        pass

    def set_node_gauges(self, node: str, gauges: dict[str, float]) -> None:
        pass

    def observe_gpu_memory(self, worker: int, peak_allocated_bytes: int) -> None:
        pass
