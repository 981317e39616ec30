"""One engine step on the device: a StepPlan's tokens through the model, then sampling.

    runner = ModelRunner(model, attention, sampler)
    output = runner.run(plan, rows, histories)   # SampleOutput for the rows that sample, in order

The model is any LLM-shaped module: `model(input_ids [T], positions [T], attention) -> hidden [T, D]`
and `model.logits(hidden [N, D]) -> float32 [N, V]`. Attention is planned once per step (the KV
pool's PagedAttention) and every layer reuses the plan. Decode-only steps replay a CUDA graph of
the smallest captured row count that holds them (mstar.llm.graphs), when graphs were captured.
"""

from __future__ import annotations

import numpy as np
import torch

from mstar.engine.kv.attention import PagedAttention
from mstar.engine.transfer import to_device
from mstar.llm.sampling import RowSampling, SampleOutput, Sampler
from mstar.llm.scheduler import StepPlan


class ModelRunner:
    def __init__(self, model: torch.nn.Module, attention: PagedAttention, sampler: Sampler, graphs=None):
        self.model = model
        self.attention = attention
        self.sampler = sampler
        self.device = attention.device
        self.graphs = graphs  # mstar.llm.graphs.DecodeGraphs, or None (eager)
        self.num_graph_steps = 0

    @torch.inference_mode()
    def run(
        self,
        plan: StepPlan,
        rows: list[RowSampling],
        histories: list[tuple[list[int], list[int]]] | None = None,
    ) -> SampleOutput | None:
        """Compute the plan's tokens; sample one token for each row that completes its sequence
        (`rows` gives their parameters, in plan order). None when no row samples."""
        layout = plan.layout(self.attention.pool.page_tokens)
        input_ids = torch.tensor(plan.input_ids(), dtype=torch.int64)
        positions = torch.from_numpy(layout.new_positions.copy())
        sample_rows = [index for index, row in enumerate(plan.rows) if row.samples]
        last_tokens = torch.from_numpy((layout.qo_indptr[1:] - 1).astype(np.int64)[sample_rows])
        if self.graphs is not None and self.graphs.fits(layout):
            logits = self.graphs.run(layout, input_ids, positions)[: len(plan.rows)]
            self.num_graph_steps += 1
        else:
            self.attention.plan(layout)
            hidden = self.model(
                to_device(input_ids, self.device), to_device(positions, self.device), self.attention
            )
            logits = self.model.logits(hidden[to_device(last_tokens, self.device)])
            sample_rows = list(range(len(sample_rows)))  # logits hold the sampling rows only
        if not rows:
            return None
        if len(sample_rows) != logits.shape[0]:
            logits = logits[to_device(torch.tensor(sample_rows), self.device)]
        return self.sampler.sample(logits, rows, histories)
