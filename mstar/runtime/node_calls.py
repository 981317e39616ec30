"""A node's bookkeeping calls, guarded: a bug in a node's counters never stops the step loop."""

from __future__ import annotations

from mstar.graph import Node, RequestState


def recompiles_of(node: Node) -> int:
    try:
        return int(node.num_recompiles())
    except Exception:
        return 0


def event_counts_of(node: Node) -> dict[str, int]:
    try:
        return {str(name): int(count) for name, count in node.event_counts().items()}
    except Exception:
        return {}


def gauges_of(node: Node) -> dict[str, float]:
    try:
        return {str(name): float(value) for name, value in node.gauges().items()}
    except Exception:
        return {}


def step_cost_of(node: Node, state: RequestState) -> int:
    try:
        return int(node.step_cost(state))
    except Exception:
        return 0
