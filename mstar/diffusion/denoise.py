"""The denoise-loop node every diffusion family uses (the `Loop(...)` stage of its walks), driving
the family's pipeline object through the methods diffusers' pipelines name:

    start = pipeline.prepare_latents(request)     # once per request, in prepare: DenoiseStart
    outputs = pipeline.predict(items)             # once per step: every (request, label) packed
    guided = pipeline.guide(per_label, scale)     # per request: the family's guidance rule
    latents = pipeline.step(state, guided)        # per request: its sampler's step
    pipeline.finish(request, state)               # after its last step: what the loop leaves

A request's labels (its streams: "cond", and "uncond" under classifier-free guidance, or whatever
set its family names) and its latents (a tensor, or several per request: video and audio) are the
pipeline's business; the node only packs, counts and stops. Its step cost is the request's tokens
per label times its labels (the unit of max_tokens_per_step). Boot warmup runs one and two items
of each configured size through `predict` (`pipeline.warmup_item(size)`, or each of
`pipeline.warmup_items(size)` where the family warms several kinds of item: FLUX.2's edits), or
the batches of `pipeline.warmup_steps(size)` where a step's mix of kinds changes the graph (LTX-2's
isolated items), then marks the compiled parts warm: a compile after that is a recompile.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mstar.diffusion.kept import KeptText
from mstar.graph import COND, UNCOND, Node, RequestState

__all__ = ["COND", "UNCOND", "DenoiseItem", "DenoiseNode", "DenoiseStart", "DenoiseState", "cfg_combine"]


class Sampler(Protocol):
    """What DenoiseNode needs of a sampler (mstar.diffusion.samplers implements it)."""

    num_steps: int
    step_index: int
    timesteps: torch.Tensor
    sigmas: torch.Tensor

    @property
    def done(self) -> bool: ...

    def step(self, model_output: torch.Tensor, sample: torch.Tensor) -> torch.Tensor: ...


@dataclass
class DenoiseItem:
    """One (request, label) of a packed step, as the pipeline's predict sees it."""

    request_id: str
    label: str
    latents: Any  # current sample (float32, the family's latent layout; or a tuple of them)
    timestep: float  # sampler.timesteps[step_index], the model's timestep input scale
    sigma: float  # sampler.sigmas[step_index]
    step_index: int
    text: Any  # this label's conditioning (DenoiseStart.texts[label])
    condition: dict[str, Any]  # DenoiseStart.condition of the request
    kept: KeptText | None = None  # the node's budget for text work kept across steps (None: no node)


def kept_per_label(item: DenoiseItem, key: str, compute: Callable[[], Any], text: str | None = None) -> Any:
    """A value computed at the request's first step for this item's label and kept in the request's
    condition under `key` (label -> value) for its other steps; the node drops it at the request's
    last step, or when the request leaves the loop before it. For work
    that depends on the text only (cross-attention keys/values, a refined caption). `text` keeps it
    under that name instead of the label, so labels that read the same text share one. Past the
    node's budget (item.kept) the value is computed and not kept: the next step tries again."""
    name = item.label if text is None else text
    kept = item.condition.get(key, {})
    if name in kept:
        return kept[name]
    value = compute()
    if item.kept is None:  # an item built outside a node (a warmup item): kept while it lives
        item.condition.setdefault(key, {})[name] = value
    else:
        item.kept.keep(item.request_id, value, item.condition, key, name)
    return value


@dataclass
class DenoiseStart:
    """What a request starts its loop with (the pipeline's prepare_latents)."""

    latents: Any  # initial sample
    sampler: Sampler
    num_tokens: int  # tokens one label adds to a step (step_cost counts every label)
    texts: dict[str, Any]  # label -> its conditioning; the keys are the request's labels, in order
    guidance_scale: float = 1.0
    condition: dict[str, Any] = field(default_factory=dict)  # per-request state the pipeline reads


@dataclass
class DenoiseState:
    """request.state[node.name] while the request is in the loop."""

    latents: Any
    sampler: Sampler
    num_tokens: int
    guidance_scale: float
    texts: dict[str, Any]
    condition: dict[str, Any]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(self.texts)


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)


class DenoisePipeline(Protocol):
    """A family's pipeline as DenoiseNode drives it (see the module docstring)."""

    def prepare_latents(self, request: RequestState) -> DenoiseStart: ...

    def predict(self, items: list[DenoiseItem]) -> list[Any]: ...

    def guide(self, outputs: dict[str, Any], guidance_scale: float) -> Any: ...

    def step(self, state: DenoiseState, guided: Any) -> Any: ...

    def finish(self, request: RequestState, state: DenoiseState) -> None: ...

    def warmup_item(self, size: Any) -> DenoiseItem: ...


class Warmable(Protocol):
    def finish_warmup(self) -> None: ...

    @property
    def num_recompiles(self) -> int: ...


class DenoiseNode(Node):
    """Loop node: per request its pipeline state; one packed predict per step."""

    def __init__(
        self,
        pipeline: DenoisePipeline,
        name: str = "dit",
        compiled: Warmable | None = None,
        warmup_sizes: Sequence[Any] = (),
        max_batch_size: int = 8,
        max_step_cost: int | None = None,
        lora: Any = None,
        kept: KeptText | None = None,
    ):
        self.pipeline = pipeline
        # what requests keep from their text across steps, under one budget (None: no bound)
        self.kept = kept if kept is not None else KeptText(None)
        # mstar.engine.lora.serving.LoraServing when the server has adapters: the pipeline's
        # predict sets each step's rows; the node acquires, waits for and releases them.
        self.lora = lora
        self.name = name
        self.compiled = compiled  # the DiT's compiled parts (mstar.engine.compile.CompiledParts)
        self.warmup_sizes = list(warmup_sizes)  # config compile sizes; None is the family's default
        self.max_batch_size = max_batch_size
        self.max_step_cost = max_step_cost

    def prepare(self, request: RequestState) -> None:
        choices = getattr(request.params, "lora", ())
        if choices and self.lora is None:
            raise ValueError("this server has no LoRA adapters (its lora_dir is not set)")
        start = self.pipeline.prepare_latents(request)
        cost = start.num_tokens * len(start.texts)
        if self.max_step_cost is not None and cost > self.max_step_cost:
            # The API refuses these at validation; a step above the cap is what boot sizing excludes.
            raise ValueError(
                f"the request needs {cost} tokens per step, above max_tokens_per_step={self.max_step_cost}"
            )
        request.state[self.name] = DenoiseState(
            latents=start.latents,
            sampler=start.sampler,
            num_tokens=start.num_tokens,
            guidance_scale=float(start.guidance_scale),
            texts=start.texts,
            condition=start.condition,
        )
        if choices:
            self.lora.acquire(request.request_id, choices)

    def ready(self, request: RequestState) -> bool:
        """False while the request's adapters load (it waits in the queue, off the step)."""
        return self.lora is None or self.lora.ready(request.request_id)

    def _state(self, request: RequestState) -> DenoiseState:
        if self.name not in request.state:
            self.prepare(request)
        return request.state[self.name]

    def batch_key(self, request: RequestState) -> Hashable:
        return self.name  # ragged attention: every request can share a step

    def step_cost(self, request: RequestState) -> int:
        state = self._state(request)
        return state.num_tokens * len(state.labels)

    def forward(self, batch: list[RequestState]) -> None:
        states = [self._state(request) for request in batch]
        items = [
            self._item(request, state, label)
            for request, state in zip(batch, states, strict=True)
            for label in state.labels
        ]
        outputs = iter(self.pipeline.predict(items))
        for request, state in zip(batch, states, strict=True):
            per_label = {label: next(outputs) for label in state.labels}
            guided = self.pipeline.guide(per_label, state.guidance_scale)
            state.latents = self.pipeline.step(state, guided)
            if state.sampler.done:
                self.pipeline.finish(request, state)
                self.kept.free(request.request_id)  # its text work is not read again
                if self.lora is not None:
                    self.lora.release(request.request_id)  # its slots may go to waiting requests

    def _item(self, request: RequestState, state: DenoiseState, label: str) -> DenoiseItem:
        index = state.sampler.step_index
        return DenoiseItem(
            request_id=request.request_id,
            label=label,
            latents=state.latents,
            timestep=float(state.sampler.timesteps[index]),
            sigma=float(state.sampler.sigmas[index]),
            step_index=index,
            text=state.texts[label],
            condition=state.condition,
            kept=self.kept,
        )

    def release(self, request: RequestState) -> None:
        """Drop the request's loop state; a pipeline holding resources per request (pages of a KV
        pool) gets them back through its `release(state)`, on finish, failure and cancel alike."""
        state = request.state.pop(self.name, None)
        self.kept.free(request.request_id)
        if self.lora is not None:
            self.lora.release(request.request_id)
        release = getattr(self.pipeline, "release", None)
        if state is not None and release is not None:
            release(state)

    def event_counts(self) -> dict[str, int]:
        counts = getattr(self.pipeline, "event_counts", None)
        events = {} if counts is None else dict(counts())
        events["kept_text_refused"] = self.kept.num_refused
        return events

    def gauges(self) -> dict[str, float]:
        gauges = getattr(self.pipeline, "gauges", None)
        return {} if gauges is None else gauges()

    def check_stop(self, request: RequestState) -> bool:
        state = request.state.get(self.name)
        return state is not None and state.sampler.done

    def progress(self, request: RequestState) -> tuple[int, int] | None:
        state = request.state.get(self.name)
        if state is None:
            return None
        return state.sampler.step_index, state.sampler.num_steps

    def warmup(self) -> None:
        """One item, then a pair that reuses its graph, per configured size (and kind of item)."""
        self._warmup_predicts()
        if self.lora is not None and self.warmup_sizes:
            self._warmup_lora()
        if self.compiled is not None:
            self.compiled.finish_warmup()

    def _warmup_lora(self) -> None:
        """The same items with (zero-scale) adapters: the layers' LoRA graphs compile now."""
        with self.lora.warming() as widths:
            for width in widths:
                self.lora.warm(width)
                self._warmup_predicts()

    def _warmup_predicts(self) -> None:
        steps = getattr(self.pipeline, "warmup_steps", None)
        many = getattr(self.pipeline, "warmup_items", None)
        for size in self.warmup_sizes:
            if steps is not None:  # the family's own batches, each one packed step
                for batch in steps(size):
                    self.pipeline.predict(batch)
                continue
            for item in many(size) if many is not None else [self.pipeline.warmup_item(size)]:
                self.pipeline.predict([item])
                self.pipeline.predict([item, item])

    def num_recompiles(self) -> int:
        return 0 if self.compiled is None else self.compiled.num_recompiles
