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
from itertools import accumulate

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
        sample_rows = [index for index, row in enumerate(plan.rows) if row.samples]
        staged = StagedInputs.of(plan, layout, sample_rows, feed, self.device)
        input_ids, positions = staged.input_ids, staged.positions
        if staged.feed_positions is not None:
            input_ids[staged.feed_positions] = feed.source.token_ids[staged.feed_indices]
        graph_layout = self.graphs.graph_layout(layout) if self.graphs is not None else None
        if graph_layout is not None:  # logits of every packed token (and of the padding after them)
            logits = self._sampled(self.graphs.run(graph_layout, input_ids, positions), staged)
            self.num_graph_steps += 1
        else:
            self.attention.plan(layout)
            hidden = self.model(input_ids, positions, self.attention)
            logits = self.model.logits(self._sampled(hidden, staged))
        if not rows:
            return None
        return self.sampler.launch(logits, rows, histories)

    def _sampled(self, packed: torch.Tensor, staged: StagedInputs) -> torch.Tensor:
        """packed [T, ...] (a row per new token) -> the rows of the tokens that sample: the last
        new token of each sampling segment, in plan order."""
        if staged.last_tokens is None:
            return packed[: staged.num_sampled]  # a decode step where every row samples: no index
        return packed[staged.last_tokens]


@dataclass
class StagedInputs:
    """A step's int64 inputs, built on the host and copied to the device at once (one staged
    copy a step, not one per tensor): the packed input ids and positions [T], the packed index of
    each sampling row's last token (None when the step is decode rows that all sample: the first
    num_sampled rows) and the fed tokens' packed positions and their rows in the source samples."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    num_sampled: int
    last_tokens: torch.Tensor | None = None
    feed_positions: torch.Tensor | None = None
    feed_indices: torch.Tensor | None = None

    @classmethod
    def of(cls, plan: StepPlan, layout, sample_rows: list[int], feed: Feed | None, device) -> StagedInputs:
        num_tokens = layout.total_q
        parts = [np.fromiter(plan.input_ids(), dtype=np.int64, count=num_tokens), layout.new_positions]
        all_sample = layout.num_prefill == 0 and len(sample_rows) == layout.num_segments
        if not all_sample:
            parts.append((layout.qo_indptr[1:] - 1).astype(np.int64)[sample_rows])
        num_fed = len(feed.positions) if feed is not None else 0
        if num_fed:
            parts += [np.asarray(feed.positions, dtype=np.int64), np.asarray(feed.indices, dtype=np.int64)]
        staged = to_device(torch.from_numpy(np.concatenate(parts)), device)
        ends = list(accumulate(len(part) for part in parts))
        views = iter([staged[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)])
        inputs = cls(next(views), next(views), len(sample_rows))
        if not all_sample:
            inputs.last_tokens = next(views)
        if num_fed:
            inputs.feed_positions, inputs.feed_indices = next(views), next(views)
        return inputs
