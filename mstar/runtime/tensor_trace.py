"""Content hashes of each request's tensors as they move through the nodes, for finding where two
runs of the same request and seed part ways.

    MSTAR_TRACE_TENSORS=/tmp/trace mstar serve ...

After each forward, a worker appends one JSON line per request to `<dir>/worker<k>.jsonl`: the
node, the request's id, seed and the first 60 characters of its prompt, the forward's number for
that request at that node, and the sha256 (first 16 hex digits) of every tensor that is new or
replaced since the last line: the request's named tensors, and the tensors a node keeps in its
per-request state (a denoise loop's latents, step by step). Two requests with the same prompt and seed can then be compared line by
line; the first differing hash names the node and step. A diagnostic: hashing copies each tensor
to the host and waits for the GPU, so tracing slows serving. Unset, it costs one check per forward.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

TRACE_ENV = "MSTAR_TRACE_TENSORS"
HASH_HEX_DIGITS = 16


def tensor_digest(tensor: Any) -> str:
    """sha256 of the tensor's dtype, shape and bytes (a host copy; bfloat16 read as raw bits)."""
    import torch

    host = tensor.detach().contiguous().cpu()
    raw = host.view(torch.int16) if host.dtype == torch.bfloat16 else host
    digest = hashlib.sha256(f"{host.dtype}{tuple(host.shape)}".encode())
    digest.update(raw.numpy().tobytes())
    return digest.hexdigest()[:HASH_HEX_DIGITS]


def _state_tensors(node_state: Any) -> dict[str, Any]:
    """The tensor fields of a node's per-request state (a dataclass or a dict), one level deep."""
    import torch

    if dataclasses.is_dataclass(node_state):
        fields = {f.name: getattr(node_state, f.name) for f in dataclasses.fields(node_state)}
    elif isinstance(node_state, dict):
        fields = node_state
    else:
        return {}
    return {name: value for name, value in fields.items() if isinstance(value, torch.Tensor)}


class TensorTracer:
    def __init__(self, worker: int, out_dir: Path | None):
        self.worker = worker
        self.out_dir = out_dir
        self._last_seen: dict[tuple[str, str], int] = {}  # (request, tensor name) -> id of the object
        self._num_forwards: dict[tuple[str, str], int] = {}  # (request, node) -> forwards so far

    @classmethod
    def from_env(cls, worker: int) -> TensorTracer:
        value = os.environ.get(TRACE_ENV, "").strip()
        return cls(worker, Path(value) if value else None)

    @property
    def enabled(self) -> bool:
        return self.out_dir is not None

    def after_forward(self, node_name: str, states: list[Any]) -> None:
        """One line per request of the batch (RequestState objects) with its changed tensors."""
        if self.out_dir is None:
            return
        lines = [json.dumps(self._line(node_name, state)) for state in states]
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f"worker{self.worker}.jsonl", "a") as file:
            file.write("".join(line + "\n" for line in lines))

    def forget(self, request_id: str) -> None:
        """Drop a finished request's bookkeeping."""
        for table in (self._last_seen, self._num_forwards):
            for key in [key for key in table if key[0] == request_id]:
                del table[key]

    def _line(self, node_name: str, state: Any) -> dict[str, Any]:
        request_id = state.request_id
        count_key = (request_id, node_name)
        self._num_forwards[count_key] = self._num_forwards.get(count_key, 0) + 1
        named = dict(state.tensors)
        named |= {f"{node_name}.{k}": v for k, v in _state_tensors(state.state.get(node_name)).items()}
        hashes = {}
        for name, tensor in named.items():
            if not hasattr(tensor, "detach") or self._last_seen.get((request_id, name)) == id(tensor):
                continue
            self._last_seen[(request_id, name)] = id(tensor)
            hashes[name] = tensor_digest(tensor)
        return {
            "node": node_name,
            "request_id": request_id,
            "prompt": str(getattr(state.params, "prompt", ""))[:60],
            "seed": getattr(state.params, "seed", None),
            "forward": self._num_forwards[count_key],
            "hashes": hashes,
        }


def first_divergences(trace_dir: Path) -> list[str]:
    """For each (prompt, seed) traced more than once: where its later runs first differ from its
    first run (node, forward, tensor), or that they match. Lines are read in the order written."""
    runs: dict[tuple[str, Any], dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(Path(trace_dir).glob("worker*.jsonl")):
        for line in map(json.loads, path.read_text().splitlines()):
            group = runs.setdefault((line["prompt"], line["seed"]), {})
            group.setdefault(line["request_id"], []).append(line)
    report = []
    for (prompt, seed), by_request in runs.items():
        first_id, *later_ids = by_request
        for later_id in later_ids:
            where = _first_difference(by_request[first_id], by_request[later_id])
            report.append(f"prompt {prompt!r} seed {seed}: {later_id} vs {first_id}: {where}")
    return report


def _first_difference(first: list[dict[str, Any]], later: list[dict[str, Any]]) -> str:
    for a, b in zip(first, later, strict=False):
        if (a["node"], a["forward"]) != (b["node"], b["forward"]):
            return f"different paths: {a['node']}#{a['forward']} vs {b['node']}#{b['forward']}"
        differing = sorted(
            k for k in a["hashes"].keys() | b["hashes"].keys() if a["hashes"].get(k) != b["hashes"].get(k)
        )
        if differing:
            return f"first differ at {a['node']} forward {a['forward']}: {', '.join(differing)}"
    if len(first) != len(later):
        return f"same hashes, but {len(first)} vs {len(later)} forwards"
    return f"identical at every node and step ({len(first)} forwards)"


if __name__ == "__main__":  # python -m mstar.runtime.tensor_trace DIR
    import sys

    print("\n".join(first_divergences(Path(sys.argv[1]))) or "no request traced twice")
