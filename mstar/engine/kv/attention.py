"""PagedAttention: attention over the KV pool, planned once per step and run in every layer.

    attention = build_paged_attention(pool, PagedHeads(...), backend="auto")
    attention.plan(layout)                       # once per step (a PagedLayout)
    out = attention.forward(layer, q, k, v)      # per layer: store the step's k/v, attend over the pool

`forward` writes the new tokens' keys and values [total_q, kv_heads, head_dim] to their slots, then
runs q [total_q, heads, head_dim] against each segment's tokens in the pool (causal, the new tokens
last) and returns [total_q, heads, head_dim]. The write index (pool rows of the new tokens' keys,
then of their values) is staged to the device once per plan, through pinned memory, and every
layer reuses it: one copy a layer writes both.

Decode steps can replay CUDA graphs (`plan(layout, graph_rows=B)`): the step is padded to B decode
rows (the padding rows write to and read the pool's scratch page) and planned into wrappers and
buffers that keep their addresses, so a graph captured once per B replays every later step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mstar.engine.attention.wrapper import PlanWrapper
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVPool

NUM_SLOTS = 2  # a plan ring: the step being planned never rewrites what the running one reads


@dataclass(frozen=True)
class PagedHeads:
    """The attention shape a paged backend plans for (FlashInfer's plan needs it up front)."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    page_tokens: int
    scale: float


class PagedWrapper(PlanWrapper):
    """A backend's plan for one paged layout; `run_paged` reads the pool in every layer."""

    def is_host_layout(self, layout: object) -> bool:
        return isinstance(layout, PagedLayout)

    def run_paged(self, q: torch.Tensor, pool: KVPool, layer: int) -> torch.Tensor:
        raise NotImplementedError


class PagedBackend:
    """What build_paged_attention picks: a name, the library version and a wrapper factory."""

    name: str = ""
    version: str = ""
    max_pages: int | None = None  # page-table entries a captured wrapper holds (None: no bound)

    def make_wrapper(self, captured: bool, num_rows: int | None = None) -> PagedWrapper:
        raise NotImplementedError


class PagedAttention:
    def __init__(self, backend: PagedBackend, pool: KVPool, heads: PagedHeads):
        if heads.page_tokens != pool.page_tokens:
            raise ValueError(
                f"paged attention: {heads.page_tokens}-token pages, the pool has {pool.page_tokens}"
            )
        self.backend = backend
        self.backend_name = backend.name
        self.pool = pool
        self.heads = heads
        self.device = pool.device
        self._ring = [backend.make_wrapper(captured=False) for _ in range(NUM_SLOTS)]
        self._next = 0
        self._graph_wrappers: dict[int, PagedWrapper] = {}
        self._graph_rows: dict[int, torch.Tensor] = {}  # static write index [2 B] per graph size
        self._active: PagedWrapper | None = None
        self._write_rows: torch.Tensor | None = None
        self.layout: PagedLayout | None = None

    def __repr__(self) -> str:
        return f"PagedAttention(backend={self.backend.version!r}, pool={self.pool.describe()!r})"

    # ---- planning (host, once per step) --------------------------------------------------

    def plan(self, layout: PagedLayout, graph_rows: int | None = None) -> PagedLayout:
        """Make `layout` what every layer's forward runs; returns the layout actually planned
        (padded to `graph_rows` decode rows when a CUDA graph of that size will replay it)."""
        self._active = None
        if graph_rows is not None:
            layout = pad_decode_layout(layout, graph_rows, self.pool.scratch_page)
            wrapper = self._graph_wrapper(graph_rows)
            wrapper.plan(layout)
            rows = self._graph_rows[graph_rows]
            rows.copy_(self._host_rows(layout), non_blocking=True)
            self._write_rows = rows
        else:
            wrapper = self._ring_wrapper(layout)
            wrapper.plan(layout)
            self._write_rows = self._stage(self._host_rows(layout))
        self._active, self.layout = wrapper, layout
        return layout

    def _ring_wrapper(self, layout: PagedLayout) -> PagedWrapper:
        for wrapper in self._ring:
            if wrapper.planned_layout == layout:
                return wrapper
        wrapper = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        return wrapper

    def _graph_wrapper(self, num_rows: int) -> PagedWrapper:
        wrapper = self._graph_wrappers.get(num_rows)
        if wrapper is None:
            with torch.inference_mode(False):
                wrapper = self.backend.make_wrapper(captured=True, num_rows=num_rows)
                self._graph_rows[num_rows] = torch.zeros(2 * num_rows, dtype=torch.int64, device=self.device)
            self._graph_wrappers[num_rows] = wrapper
        return wrapper

    def _host_rows(self, layout: PagedLayout) -> torch.Tensor:
        rows = self.pool.kv_rows(layout.write_slots)  # [2 total_q]: key rows, then value rows
        host = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        return host.pin_memory() if self.device.type == "cuda" else host

    def _stage(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return host
        return host.to(self.device, non_blocking=True)

    # ---- running (every layer) -----------------------------------------------------------

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, heads, D], k/v [T, kv_heads, D] of the planned step's new tokens -> [T, heads, D]."""
        if self._active is None or self._write_rows is None:
            raise RuntimeError("paged attention: forward before plan (or after a failed plan)")
        self.pool.write_kv(layer, self._write_rows, k, v)
        return self._active.run_paged(q.to(self.heads.dtype), self.pool, layer)

    def write_only(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the planned step's keys and values without attending (a prefix prefilled for
        later readers, such as a DiT's text tokens)."""
        if self._write_rows is None:
            raise RuntimeError("paged attention: write before plan")
        self.pool.write_kv(layer, self._write_rows, k, v)


def pad_decode_layout(layout: PagedLayout, num_rows: int, scratch_page: int) -> PagedLayout:
    """A decode-only layout padded to `num_rows` rows; each padding row is one token on the
    scratch page (never handed to a sequence), so padded steps write nothing that is read."""
    if layout.num_prefill or layout.num_segments > num_rows:
        raise ValueError(
            f"a CUDA-graph decode step takes up to {num_rows} decode rows, got {layout.num_decode} "
            f"decode and {layout.num_prefill} prefill segments"
        )
    extra = num_rows - layout.num_segments
    if extra == 0:
        return layout
    return layout.with_scratch_rows(extra, scratch_page)
