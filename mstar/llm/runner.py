"""One engine step on the device: a StepPlan's tokens through the model, then sampling.

    runner = ModelRunner(model, attention, sampler)
    output = runner.run(plan, rows, histories)   # SampleOutput for the rows that sample, in order

The model is any LLM-shaped module: `model(input_ids [T], positions [T], attention) -> hidden [T, D]`
and `model.logits(hidden [N, D]) -> float32 [N, V]`. Attention is planned once per step (the KV
pool's PagedAttention) and every layer reuses the plan. Decode-only steps replay a CUDA graph of
the smallest captured row count that holds them (mstar.llm.graphs), when graphs were captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mstar.engine.kv.attention import PagedAttention
from mstar.engine.transfer import to_device
from mstar.llm.sampling import PendingSamples, RowSampling, SampleOutput, Sampler
from mstar.llm.scheduler import StepPlan


@dataclass
class Feed:
    """Inputs of this step still on the device: the tokens the previous step sampled. Packed input
    `positions[i]` takes `source.token_ids[indices[i]]` (no trip through the host)."""

    positions: list[int]
    source: PendingSamples
    indices: list[int]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, attention: PagedAttention, sampler: Sampler, graphs=None):
        self.model = model
        self.attention = attention
        self.sampler = sampler
        self.device = attention.device
        self.graphs = graphs  # mstar.llm.graphs.DecodeGraphs, or None (eager)
        self.num_graph_steps = 0

    def run(
        self,
        plan: StepPlan,
        rows: list[RowSampling],
        histories: list[tuple[list[int], list[int]]] | None = None,
    ) -> SampleOutput | None:
        """Compute the plan's tokens and wait for the samples (see `launch`)."""
        pending = self.launch(plan, rows, histories)
        return None if pending is None else pending.read()

    @torch.inference_mode()
    def launch(
        self,
        plan: StepPlan,
        rows: list[RowSampling],
        histories: list[tuple[list[int], list[int]]] | None = None,
        feed: Feed | None = None,
    ) -> PendingSamples | None:
        """Queue the plan's tokens through the model and one sample for each row that completes its
        sequence (`rows` gives their parameters, in plan order); None when no row samples."""
        layout = plan.layout(self.attention.pool.page_tokens)
        input_ids = to_device(torch.tensor(plan.input_ids(), dtype=torch.int64), self.device)
        if feed is not None and feed.positions:
            positions_index = to_device(torch.tensor(feed.positions, dtype=torch.int64), self.device)
            source_index = to_device(torch.tensor(feed.indices, dtype=torch.int64), self.device)
            input_ids[positions_index] = feed.source.token_ids[source_index]
        positions = to_device(torch.from_numpy(layout.new_positions.copy()), self.device)
        sample_rows = [index for index, row in enumerate(plan.rows) if row.samples]
        graph_layout = self.graphs.graph_layout(layout) if self.graphs is not None else None
        if graph_layout is not None:  # logits of every packed token (and of the padding after them)
            logits = self._sampled(self.graphs.run(graph_layout, input_ids, positions), layout, sample_rows)
            self.num_graph_steps += 1
        else:
            self.attention.plan(layout)
            hidden = self.model(input_ids, positions, self.attention)
            logits = self.model.logits(self._sampled(hidden, layout, sample_rows))
        if not rows:
            return None
        return self.sampler.launch(logits, rows, histories)

    def _sampled(self, packed: torch.Tensor, layout, sample_rows: list[int]) -> torch.Tensor:
        """packed [T, ...] (a row per new token) -> the rows of the tokens that sample: the last
        new token of each sampling segment, in plan order."""
        if layout.num_prefill == 0 and len(sample_rows) == layout.num_segments:
            return packed[: layout.num_segments]  # a decode step where every row samples: no index
        last_tokens = torch.from_numpy((layout.qo_indptr[1:] - 1).astype(np.int64)[sample_rows])
        return packed[to_device(last_tokens, self.device)]
