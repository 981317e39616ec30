"""What our server's /metrics says about a benchmark phase: recompiles, each node's device and host
time per step, and where a request's time went on the server (its walks, its end to end, the API's
media encode). Another server has no such metrics: its scrapes give None and the figures are left out.
"""

from __future__ import annotations

from typing import Any

RECOMPILES_METRIC = "mstar:recompiles_total"
STEP_METRIC = "mstar:step_duration_seconds"
STEP_HOST_METRIC = "mstar:step_host_duration_seconds"
E2E_METRIC = "mstar:e2e_request_latency_seconds"
WALK_METRIC = "mstar:walk_duration_seconds"
ENCODE_METRIC = "mstar:media_encode_seconds"
READY_METRIC = "mstar:media_ready_seconds"
STAGE_METRICS = {E2E_METRIC: "e2e", ENCODE_METRIC: "encode", READY_METRIC: "ready"}  # and walks


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample in a Prometheus text scrape; none when the text
    is not one (another server's /metrics page must not end the benchmark)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return []
    return [(sample.name, sample.labels, sample.value) for family in families for sample in family.samples]


def recompiles_from_metrics(text: str) -> int:
    """Sum of every `mstar:recompiles_total{...}` sample (0 before the first recompile)."""
    return int(sum(value for name, _, value in _samples(text) if name == RECOMPILES_METRIC))


def node_seconds_from_metrics(text: str) -> dict[str, list[float]]:
    """node -> [device seconds, steps, host seconds] summed over `mstar:step_duration_seconds` and
    `mstar:step_host_duration_seconds` (their sum and count samples)."""
    columns = {STEP_METRIC + "_sum": 0, STEP_METRIC + "_count": 1, STEP_HOST_METRIC + "_sum": 2}
    totals: dict[str, list[float]] = {}
    for name, labels, value in _samples(text):
        column = columns.get(name)
        if column is not None and "node" in labels:
            totals.setdefault(labels["node"], [0.0, 0.0, 0.0])[column] += value
    return totals


def _differences(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per key, `after`'s sums less `before`'s (a key first seen after counts from zero)."""
    differences = {}
    for key, values in after.items():
        earlier = before.get(key, [0.0] * len(values))
        differences[key] = [value - old for value, old in zip(values, earlier, strict=True)]
    return differences


def node_breakdown(before: dict, after: dict, num_requests: int) -> dict[str, dict[str, float]]:
    """Per node, between two scrapes: ms per step and ms per request (where the time went)."""
    breakdown = {}
    for node, (seconds, steps, host_seconds) in _differences(before, after).items():
        if steps > 0 and num_requests > 0:
            breakdown[node] = {
                "ms_per_step": 1000 * seconds / steps,
                "host_ms_per_step": 1000 * host_seconds / steps,
                "ms_per_request": 1000 * seconds / num_requests,
                "steps_per_request": steps / num_requests,
            }
    return breakdown


async def scrape_metrics(client: Any) -> str | None:
    """None when the server has no /metrics (another server)."""
    try:
        response = await client.get("/metrics")
    except Exception:  # a failed scrape must not end the benchmark
        return None
    return response.text if response.status_code == 200 else None


async def scrape_recompiles(client: Any) -> int | None:
    text = await scrape_metrics(client)
    return None if text is None else recompiles_from_metrics(text)


def stage_seconds_from_metrics(text: str) -> dict[str, list[float]]:
    """stage -> [seconds, count] summed over the samples of the request-level histograms:
    "e2e" (submission to end, in the conductor), "walk:<name>" per walk, "encode" (the API's), and
    "ready" (the request's arrival at the API to its response media being ready)."""
    totals: dict[str, list[float]] = {}
    for name, labels, value in _samples(text):
        metric, _, sample = name.rpartition("_")
        if sample not in ("sum", "count") or (metric not in STAGE_METRICS and metric != WALK_METRIC):
            continue
        stage = STAGE_METRICS.get(metric) or "walk:" + labels["walk"]
        totals.setdefault(stage, [0.0, 0.0])[sample == "count"] += value
    return totals


def stage_breakdown(before: dict, after: dict, num_requests: int) -> dict[str, float]:
    """ms per request of each stage between two scrapes ("e2e", "walk:<name>", "encode", "ready")."""
    return {
        stage: 1000 * seconds / num_requests
        for stage, (seconds, count) in _differences(before, after).items()
        if count > 0 and num_requests > 0
    }
