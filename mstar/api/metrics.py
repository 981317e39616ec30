"""Prometheus metrics (prefix `mstar:`, label model_name) on a per-app registry.

`PrometheusMetrics` implements the runtime's MetricsSink protocol (INTERFACES.md section 1): the runtime
calls observe_* as requests and steps happen; running/waiting gauges are read from Runtime.stats() at
scrape time so they can never drift.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from mstar.api.text_metrics import TextMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
QUEUE_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
WALK_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
ENCODE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
TOKEN_BUCKETS = tuple(2**p for p in range(6, 20))


class _StatsCollector:
    """Running/waiting gauges read from the runtime at scrape time."""

    def __init__(self, model_name: str, read_stats: Callable[[], Any] | None):
        self.model_name = model_name
        self.read_stats = read_stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily(
            "mstar:num_requests_running", "Requests in a worker step loop", labels=["model_name"]
        )
        waiting = GaugeMetricFamily(
            "mstar:num_requests_waiting", "Requests admitted but waiting to run", labels=["model_name"]
        )
        stats = self.read_stats() if self.read_stats is not None else None
        running.add_metric([self.model_name], getattr(stats, "num_running", 0))
        waiting.add_metric([self.model_name], getattr(stats, "num_waiting", 0))
        yield running
        yield waiting


class PrometheusMetrics:
    """MetricsSink on its own CollectorRegistry (one per app, so tests can build many apps)."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._stats = _StatsCollector(model_name, None)
        self.registry.register(self._stats)
        labels = ["model_name"]
        self.queue_time = Histogram(
            "mstar:request_queue_time_seconds",
            "Time from admission to the first step",
            labels,
            buckets=QUEUE_BUCKETS_S,
            registry=self.registry,
        )
        self.e2e_latency = Histogram(
            "mstar:e2e_request_latency_seconds",
            "Time from submission to the end of the request",
            labels,
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.walk_time = Histogram(
            "mstar:walk_duration_seconds",
            "Time from a walk's dispatch to its end, seen by the conductor: its nodes' work plus the "
            "hand-offs and waits between them",
            [*labels, "walk"],
            buckets=WALK_BUCKETS_S,
            registry=self.registry,
        )
        self.media_encode_time = Histogram(
            "mstar:media_encode_seconds",
            "Time from a request's end to its response media being ready in the API: image encodes "
            "and the b64_json body; for clips muxed as they decode, the mux's rest after the last piece",
            [*labels, "format"],
            buckets=ENCODE_BUCKETS_S,
            registry=self.registry,
        )
        self.media_ready_time = Histogram(
            "mstar:media_ready_seconds",
            "Time from a request's arrival at the API to its response media being ready: an image "
            "response's body, or a video job's MP4 (what a client waits for, less the transfer and "
            "a video client's polling)",
            [*labels, "format"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.step_time = Histogram(
            "mstar:step_duration_seconds",
            "Duration of one step of one node (the denoise step is node 'dit')",
            [*labels, "node"],
            buckets=STEP_BUCKETS_S,
            registry=self.registry,
        )
        self.step_host_time = Histogram(
            "mstar:step_host_duration_seconds",
            "Host time of one step's forward of one node: queueing its work, plus any wait inside it "
            "for the device (a read-back); compare with mstar:step_duration_seconds",
            [*labels, "node"],
            buckets=STEP_BUCKETS_S,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "mstar:step_batch_size",
            "Requests per step",
            [*labels, "node"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.tokens_per_step = Histogram(
            "mstar:step_tokens",
            "Step cost (tokens, both guidance labels) per step",
            [*labels, "node"],
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.requests = Counter(
            "mstar:requests",
            "Finished requests by outcome (completed/failed/aborted/timeout; rejected = refused at admission)",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self.gpu_peak_allocated = Gauge(
            "mstar:gpu_memory_peak_allocated_bytes",
            "Most bytes a worker's tensors held on its GPUs over its last heartbeat interval "
            "(torch.cuda.max_memory_allocated, the figure diffusers benchmarks report; device-wide "
            "usage adds the CUDA context and the allocator's cache)",
            [*labels, "worker"],
            registry=self.registry,
        )
        self.recompiles = Counter(
            "mstar:recompiles",
            "torch.compile recompiles after warmup (each one is a latency spike on the serving path)",
            [*labels, "node"],
            registry=self.registry,
        )
        self.node_events = Counter(
            "mstar:node_events",
            "Events a node counts, by name (text_encoder: prompt_cache_hits, prompt_cache_misses)",
            [*labels, "node", "event"],
            registry=self.registry,
        )
        self.text = TextMetrics(self.registry, model_name)  # text models' tokens, TTFT, KV pool

    def bind_runtime(self, read_stats: Callable[[], Any]) -> None:
        """Read running/waiting from `read_stats()` (Runtime.stats) at every scrape."""
        self._stats.read_stats = read_stats

    # MetricsSink protocol
    def observe_queue_time(self, seconds: float) -> None:
        self.queue_time.labels(self.model_name).observe(seconds)

    def observe_step(
        self, node: str, batch_size: int, cost: int, duration_s: float, host_duration_s: float = 0.0
    ) -> None:
        self.step_time.labels(self.model_name, node).observe(duration_s)
        self.step_host_time.labels(self.model_name, node).observe(host_duration_s)
        self.batch_size.labels(self.model_name, node).observe(batch_size)
        self.tokens_per_step.labels(self.model_name, node).observe(cost)

    def observe_request_end(self, outcome: str, latency_s: float) -> None:
        self.requests.labels(self.model_name, outcome).inc()
        self.e2e_latency.labels(self.model_name).observe(latency_s)

    def observe_walk(self, walk: str, seconds: float) -> None:
        self.walk_time.labels(self.model_name, walk).observe(seconds)

    def observe_gpu_memory(self, worker: int, peak_allocated_bytes: int) -> None:
        self.gpu_peak_allocated.labels(self.model_name, str(worker)).set(peak_allocated_bytes)

    def count_recompile(self, node: str, count: int) -> None:
        if count > 0:
            self.recompiles.labels(self.model_name, node).inc(count)

    def count_node_events(self, node: str, increments: dict[str, int]) -> None:
        for event, count in increments.items():
            if count > 0 and not self.text.count_event(event, count):
                self.node_events.labels(self.model_name, node, event).inc(count)

    def set_node_gauges(self, node: str, gauges: dict[str, float]) -> None:
        self.text.set_gauges(gauges)

    # API-side events
    def count_rejected(self) -> None:
        self.requests.labels(self.model_name, "rejected").inc()

    def observe_media_encode(self, output_format: str, seconds: float) -> None:
        self.media_encode_time.labels(self.model_name, output_format).observe(seconds)

    def observe_media_ready(self, output_format: str, seconds: float) -> None:
        self.media_ready_time.labels(self.model_name, output_format).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
