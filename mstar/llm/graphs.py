"""CUDA graphs of decode steps, one per captured row count (1, 2, 4, ... up to max_num_seqs).

A decode step of a small model is launch-bound: hundreds of small kernels per layer stack. Each
graph replays the whole model forward and the lm_head for B decode rows at once. A step of n <= B
decode rows is padded to B (padding rows write to and read the pool's scratch page, and their logits
are dropped); FlashInfer's captured decode wrapper is planned on the host before each replay and
copies the page table into buffers the graph reads. A step with prefill chunks whose new tokens
fit the largest graph (a prompt's tail after a prefix-cache hit, a short prompt) replays one too,
each new token a decode row of its own (PagedLayout.as_decode_rows): its eager forward would cost
the host as many launches as any other step. Larger prefill steps run eagerly.
"""

from __future__ import annotations

import logging

import torch

from mstar.engine.kv.attention import PagedAttention
from mstar.engine.kv.layout import PagedLayout

log = logging.getLogger("mstar.llm")
NUM_WARMUP_RUNS = 2
# A prefill token replayed as a decode row reads its whole context, so the rows of one chunk read
# its prefix once each (mostly from L2 while a layer's share fits there). Past this many keys read
# by a step's prefill rows it runs eagerly and reads them once: a long context cannot multiply its
# reads. (Its decode rows read what they read in any decode step: they do not count.)
MAX_GRAPH_PREFILL_KV_TOKENS = 1 << 18


# Graphs hold this many rows even where fewer sequences run (max_num_seqs 1, say): a step of that
# many new tokens (a prompt's tail after a prefix-cache hit, a short prompt) replays one too.
MIN_GRAPH_ROWS = 128


def graph_page_indices(num_pool_pages: int, page_tokens: int, max_rows: int) -> int:
    """Page-table entries a captured step can need: its decode rows' pages (at most one per pool
    page), the prefill rows' repeated prefix pages (bounded by MAX_GRAPH_PREFILL_KV_TOKENS; a page
    may be partly used at both ends of a row) and a scratch page per padding row."""
    prefill_pages = MAX_GRAPH_PREFILL_KV_TOKENS // page_tokens + 2 * max_rows
    return num_pool_pages + 1 + prefill_pages + max_rows


def default_graph_sizes(max_num_seqs: int, max_step_tokens: int | None = None) -> list[int]:
    """1, 2, 4, 8, then every 16 up to 256, every 64 beyond (padding costs at most ~12%), up to
    max_num_seqs, or to MIN_GRAPH_ROWS where steps can be that long (max_step_tokens)."""
    largest = max(max_num_seqs, min(MIN_GRAPH_ROWS, max_step_tokens or max_num_seqs))
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(320, 4097, 64))
    return [size for size in sizes if size < largest] + [largest]


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, attention: PagedAttention, sizes: list[int]):
        self.model = model
        self.attention = attention
        self.device = attention.device
        self.sizes = sorted(set(sizes))
        self.max_page_indices = attention.backend.max_pages  # a captured wrapper's page table
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def graph_layout(self, layout: PagedLayout) -> PagedLayout | None:
        """What a graph replays for this step: a decode step as it is, a step with prefill chunks
        as one decode row per new token (the same tokens in the same order; row i of the logits
        is packed token i); None when the step runs eagerly."""
        if not self._graphs or layout.total_q > self.sizes[-1]:
            return None
        if layout.num_prefill == 0:
            return layout
        if not layout.causal:
            return None
        rows = layout.as_decode_rows()
        if rows.total_kv - sum(layout.kv_lens[: layout.num_decode]) > MAX_GRAPH_PREFILL_KV_TOKENS:
            return None
        padding = self.size_for(rows) - rows.num_segments  # a scratch page each
        if self.max_page_indices is not None and rows.num_page_indices + padding > self.max_page_indices:
            return None
        return rows

    def size_for(self, layout: PagedLayout) -> int:
        """The smallest captured row count that holds the step."""
        return next(s for s in self.sizes if s >= layout.num_segments)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, in one memory pool (the graphs replay one at a time).
        A capture that fails leaves no graph: steps run eagerly, and a warning says why."""
        if self.device.type != "cuda":
            return
        try:
            pool = torch.cuda.graph_pool_handle()
            for size in sorted(self.sizes, reverse=True):
                self._graphs[size] = self._capture(size, pool)
        except Exception as error:
            self._graphs.clear()
            log.warning(
                "decode CUDA graph capture failed, decoding eagerly: %s: %s", type(error).__name__, error
            )
            return
        log.info("captured %d decode CUDA graphs (rows %s)", len(self._graphs), self.sizes)

    def _capture(
        self, size: int, pool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor, torch.Tensor]:
        input_ids = torch.zeros(size, dtype=torch.int64, device=self.device)
        positions = torch.zeros(size, dtype=torch.int64, device=self.device)
        scratch = self.attention.pool.scratch_page
        layout = PagedLayout.build(
            [1] * size, [1] * size, [[scratch]] * size, self.attention.pool.page_tokens
        )
        self.attention.plan(layout, graph_rows=size)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(NUM_WARMUP_RUNS):
                self.model.logits(self.model(input_ids, positions, self.attention))
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self.model.logits(self.model(input_ids, positions, self.attention))
        return graph, input_ids, positions, logits

    @torch.inference_mode()  # the static buffers were made under inference mode at capture
    def run(self, layout: PagedLayout, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Replay the smallest graph that holds the step; float32 logits [size, V] (the first
        layout.num_segments rows are the step's; the rest are padding). Inputs are on the device."""
        size = self.size_for(layout)
        graph, static_ids, static_positions, logits = self._graphs[size]
        self.attention.plan(layout, graph_rows=size)
        count = layout.num_segments
        static_ids[:count].copy_(input_ids)
        static_positions[:count].copy_(positions)
        static_ids[count:].zero_()
        static_positions[count:].zero_()
        graph.replay()
        return logits
