"""The LLM node's boot warmup: compile, then capture, then no compile again.

    warmup = LLMWarmup(model, attention, sampler, graphs, compiled, max_step_tokens)
    warmup()                  # the node's warmup (the worker calls it before serving)
    warmup.num_recompiles     # the model's compiles since, reported to /metrics as recompiles

The sampler warms its own compiled part first (Sampler.warmup). A model with compiled parts (mstar.models.qwen3.optimize) runs a step of each token count in
`warmup_token_counts` first: one token (a decode row: dynamo specialises size 1), two (its graph
for any other count), then the largest step the scheduler makes (which must reuse that graph, and
takes the allocator to its peak before the pool's first requests). Every token of those steps
writes and reads the pool's scratch page only. The decode CUDA graphs are captured after it (their
warmup runs then find every graph compiled: a compile inside a capture would fail it), and a compile
from then on counts as a recompile in traffic and is logged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from mstar.engine.kv.attention import PagedAttention
from mstar.engine.kv.layout import PagedLayout

log = logging.getLogger("mstar.llm")


def warmup_token_counts(max_step_tokens: int) -> list[int]:
    """1, 2 and the largest step (in that order: the first two give each compiled part its graphs)."""
    return sorted({1, min(2, max_step_tokens), max_step_tokens})


class LLMWarmup:
    def __init__(
        self,
        model: torch.nn.Module,
        attention: PagedAttention,
        sampler: Any = None,
        graphs: Any = None,
        compiled: Any = None,
        max_step_tokens: int = 2,
    ):
        self.model = model
        self.attention = attention
        self.sampler = sampler  # mstar.llm.sampling.Sampler (its warmup compiles its race), or None
        self.graphs = graphs  # mstar.llm.graphs.DecodeGraphs, or None
        self.compiled = compiled  # mstar.engine.compile.CompiledParts of the model, or None
        self.token_counts = warmup_token_counts(max_step_tokens)

    def __call__(self) -> None:
        if self.sampler is not None:
            self.sampler.warmup()
        if self.compiled is not None and self.compiled.parts:
            self._compile()
        if self.graphs is not None:
            before = self._num_compiles()
            self.graphs.capture()
            if self._num_compiles() != before:
                log.warning("the model compiled while decode CUDA graphs were captured")
        if self.compiled is not None:
            self.compiled.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return 0 if self.compiled is None else self.compiled.num_recompiles

    def _num_compiles(self) -> int:
        return 0 if self.compiled is None else sum(part.num_compiles for part in self.compiled.parts)

    @torch.inference_mode()  # as the runner and the graphs call the model: guards see the same
    def _compile(self) -> None:
        started = time.monotonic()
        for count in self.token_counts:
            self.run_step(count)
        if self.attention.device.type == "cuda":
            torch.cuda.synchronize(self.attention.device)
        names = ", ".join(part.name for part in self.compiled.parts)
        log.info(
            "compiled %s: %d graphs, at warmup steps of %s tokens, in %.1f s",
            names, self._num_compiles(), "/".join(map(str, self.token_counts)), time.monotonic() - started,
        )  # fmt: skip

    def run_step(self, num_tokens: int) -> torch.Tensor:
        """One step of `num_tokens` new tokens as the runner runs it (plan, forward, logits of the
        last token), every token on the scratch page: one decode row, or one prompt chunk."""
        pool = self.attention.pool
        pages = [pool.scratch_page] * -(-num_tokens // pool.page_tokens)
        layout = PagedLayout.build([num_tokens], [num_tokens], [pages], pool.page_tokens)
        device = self.attention.device
        input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        positions = torch.from_numpy(np.ascontiguousarray(layout.new_positions)).to(device)
        self.attention.plan(layout)
        hidden = self.model(input_ids, positions, self.attention)
        return self.model.logits(hidden[-1:])
