"""Which requests ride in one forward of a node: the pure part of the step loop.

    queue = NodeQueue()                       # per node, requests in arrival order
    queue.add("a"); queue.add("b")
    batches = plan_batches([Candidate("a", key, cost), ...], max_batch_size=8, max_step_cost=131072)

Queues in, batches out: no processes, no tensors, no nodes (the step loop asks the node for each
request's batch key and step cost and hands them in), so the rules are tested as plain data, the way
vLLM tests its scheduler.

Rules: requests are taken oldest first, those not ready (the node's `ready`: adapters loading)
skipped; each batch key gets one batch, in the order the keys first
appear; a batch takes a request while it has fewer than max_batch_size and the request's cost fits
under max_step_cost (a request alone in its batch always fits: one that can never fit is refused at
validation); a request that does not fit waits for the next round, and later ones may still fit. A
request in a denoise loop goes to the back of its queue after each step (`to_back`), so requests
take turns under the caps.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    rid: str
    key: Hashable  # the node's batch_key: requests sharing one may ride together
    cost: int  # the node's step_cost: what the request adds to a step
    ready: bool = True  # the node's readiness hook: False waits for a later round, holding no place


def plan_batches(
    candidates: Iterable[Candidate], max_batch_size: int, max_step_cost: int | None
) -> list[list[str]]:
    """Candidates in queue order -> batches of rids (see the module docstring)."""
    groups: dict[Hashable, list[str]] = {}
    costs: dict[Hashable, int] = {}
    for candidate in candidates:
        if not candidate.ready:
            continue
        group = groups.setdefault(candidate.key, [])
        if len(group) >= max(1, max_batch_size):
            continue
        if group and max_step_cost is not None and costs[candidate.key] + candidate.cost > max_step_cost:
            continue
        group.append(candidate.rid)
        costs[candidate.key] = costs.get(candidate.key, 0) + candidate.cost
    return [group for group in groups.values() if group]


class NodeQueue:
    """A node's waiting requests, oldest first."""

    def __init__(self) -> None:
        self._rids: dict[str, None] = {}  # insertion-ordered

    def add(self, rid: str) -> None:
        self._rids[rid] = None

    def discard(self, rid: str) -> None:
        self._rids.pop(rid, None)

    def to_back(self, rid: str) -> None:
        """After a loop step: behind every request that waited meanwhile (round-robin under the caps)."""
        self._rids.pop(rid, None)
        self._rids[rid] = None

    def __contains__(self, rid: object) -> bool:
        return rid in self._rids

    def __bool__(self) -> bool:
        return bool(self._rids)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._rids))
