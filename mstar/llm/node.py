"""The LLM node: a Loop stage whose every forward is one engine step of continuous batching.

The worker's step loop hands the node every request in its loop; the node's scheduler picks what
the step computes (decode rows, then prefill chunks under the token budget; preempting the newest
when pages run out), the runner computes it and samples, and each request's Generation turns the
new tokens into text. Tokens leave as inline output pieces ("text": a TextPiece dict per request
and step, or one at the end when the request does not stream). A request that stops gives its
pages back at once; `release` (finish, abort, deadline, failure) gives back whatever is left.

With `overlap` (on GPUs) a forward queues step n + 1 first, its decode inputs taken from step n's
samples still on the device, and only then reads step n back and does its host work (stop rules,
detokenizing, pieces) while the device runs n + 1. A request that stopped at step n has one wasted
row in n + 1 (its token is dropped); one whose max_tokens is reached gets no row after its last.
When the device has finished step n by then (a host-bound step, such as an eager prefill), step n
is read back first: nothing waits for it, and its tokens (a request's first) leave before step
n + 1 is queued.

Request tensors: the final walk keeps "token_ids" int64 [num_output_tokens] (no stop token).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from mstar.graph import Node, RequestState
from mstar.llm.generation import Generation
from mstar.llm.params import TextRequest
from mstar.llm.runner import Feed, ModelRunner
from mstar.llm.sampling import PendingSamples
from mstar.llm.scheduler import Scheduler, StepPlan
from mstar.llm.sequence import PENDING, Sequence, Status
from mstar.llm.tokenizer import TextTokenizer

log = logging.getLogger("mstar.llm")
TEXT_KEY, TOKEN_IDS = "text", "token_ids"
UNBOUNDED = 1 << 30  # the step loop hands over every request in the loop; the scheduler caps


@dataclass
class InFlight:
    """A step queued on the device whose samples are not read back yet."""

    plan: StepPlan
    generations: list[Generation]  # the sampling rows' requests, in order
    pending: PendingSamples | None


class LLMNode(Node):
    max_batch_size = UNBOUNDED

    def __init__(
        self,
        name: str,
        runner: ModelRunner,
        scheduler: Scheduler,
        tokenizer: TextTokenizer,
        eos_ids: tuple[int, ...],
        max_model_len: int,
        warmup_steps: Any = None,
        overlap: bool = False,
    ):
        self.name = name
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_model_len = max_model_len
        self._warmup_steps = warmup_steps
        self._generations: dict[str, Generation] = {}  # by request id
        self._states: dict[str, RequestState] = {}
        self._arrivals = itertools.count()
        self._counts = {"steps": 0, "decode_graph_steps": 0}
        self.overlap = overlap  # queue step n + 1 before reading step n back (GPUs)
        self._inflight: InFlight | None = None
        self._num_penalized = 0  # live requests with penalties (they need every token on the host)

    # ---- requests --------------------------------------------------------------------------

    def prepare(self, request: RequestState) -> None:
        text_request: TextRequest = request.params  # the spec's params_type, decoded by the worker
        seq = Sequence.new(request.request_id, text_request.prompt_token_ids, next(self._arrivals))
        generation = Generation.start(seq, text_request, self.tokenizer, self.eos_ids, self.max_model_len)
        self.scheduler.add(seq)
        self._generations[request.request_id] = generation
        self._states[request.request_id] = request
        self._num_penalized += generation.request.sampling.row(0).has_penalties

    def check_stop(self, request: RequestState) -> bool:
        generation = self._generations.get(request.request_id)
        return generation is None or generation.finished

    def release(self, request: RequestState) -> None:
        generation = self._generations.pop(request.request_id, None)
        self._states.pop(request.request_id, None)
        if generation is not None:
            self.scheduler.finish(generation.seq)
            self._num_penalized -= generation.request.sampling.row(0).has_penalties
        super().release(request)

    # ---- one step --------------------------------------------------------------------------

    def forward(self, batch: list[RequestState]) -> None:
        """Queue this step, then read back the previous one (its tokens, stops, pieces) while this
        one runs; without overlap (CPU), read this step back at once."""
        if self._inflight is not None and (self._num_penalized or self._inflight_done()):
            # penalties count every output token (all must be on the host); a finished step
            # is read at no cost, and its pieces need not wait for the next step's launch
            self._resolve()
        step = self._launch()
        if self._inflight is not None:
            self._resolve()
        self._inflight = step
        if not self.overlap and step is not None:
            self._resolve()

    def _inflight_done(self) -> bool:
        """The step in flight is finished on the device: reading it back waits for nothing."""
        pending = self._inflight.pending
        return pending is None or pending.done()

    def _launch(self) -> InFlight | None:
        plan = self.scheduler.schedule()
        if not plan.rows:
            return None
        sampled = [self._generations[row.seq.seq_id] for row in plan.rows if row.samples]
        rows = [g.request.sampling.row(g.seq.num_outputs) for g in sampled]
        histories = None
        if any(r.has_penalties for r in rows):
            histories = [(g.seq.tokens[: g.seq.num_prompt], g.seq.output_ids) for g in sampled]
        pending = self.runner.launch(plan, rows, histories, self._feed(plan))
        self.scheduler.advance(plan)
        for generation in sampled:
            generation.reserve()
        self._counts["steps"] += 1
        return InFlight(plan, sampled, pending)

    def _feed(self, plan) -> Feed | None:
        """Tokens of this step that the step in flight sampled: taken from its device copy."""
        if self._inflight is None:
            return None
        source = {id(g): index for index, g in enumerate(self._inflight.generations)}
        positions, indices, offset = [], [], 0
        for row in plan.rows:
            offset += row.num_tokens
            if row.seq.tokens[row.end - 1] == PENDING:
                positions.append(offset - 1)
                indices.append(source[id(self._generations[row.seq.seq_id])])
        return Feed(positions, self._inflight.pending, indices) if positions else None

    def _resolve(self) -> None:
        step, self._inflight = self._inflight, None
        output = step.pending.read() if step.pending is not None else None
        self.scheduler.register(step.plan)
        if output is not None:
            self._take_samples(step.generations, output)
        for generation in step.generations:
            if generation.seq.seq_id in self._states:
                self._emit(generation)

    def _take_samples(self, generations: list[Generation], output) -> None:
        for index, generation in enumerate(generations):
            logprob = top = None
            if output.logprobs is not None and generation.request.sampling.logprobs is not None:
                logprob = output.logprobs[index]
                count = generation.request.sampling.logprobs
                top = []
                if count and output.top_ids is not None:
                    ids, values = output.top_ids[index][:count], output.top_logprobs[index][:count]
                    top = [(self.tokenizer.decode([i], False), v) for i, v in zip(ids, values, strict=True)]
            was_finished = generation.finished
            generation.take(output.token_ids[index], logprob, top)
            if generation.finished and not was_finished and generation.seq.status != Status.FINISHED:
                self.scheduler.finish(generation.seq)  # its pages serve the next step already

    def _emit(self, generation: Generation) -> None:
        piece = generation.piece()
        if piece is None:
            return
        state = self._states[generation.seq.seq_id]
        if generation.finished:
            state.tensors[TOKEN_IDS] = np.asarray(generation.output_ids(), dtype=np.int64)
        if state.emit_output is not None:
            state.emit_output(TEXT_KEY, piece)

    # ---- boot and metrics ------------------------------------------------------------------

    def warmup(self) -> None:
        if self._warmup_steps is not None:
            self._warmup_steps()

    def num_recompiles(self) -> int:
        """The sampler's and the model's compiles after warmup (mstar.llm.warmup counts the model's)."""
        model = int(getattr(self._warmup_steps, "num_recompiles", 0))
        return self.runner.sampler.num_recompiles + model

    def event_counts(self) -> dict[str, int]:
        stats = self.scheduler.stats
        self._counts["decode_graph_steps"] = self.runner.num_graph_steps
        return {
            **self._counts,
            "preemptions": stats.num_preemptions,
            "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
        }

    def gauges(self) -> dict[str, float]:
        stats = self.scheduler.pages.stats()
        return {"kv_cache_usage": stats.usage, "num_running": len(self.scheduler.running)}
