"""The denoise-loop node every diffusion model uses (the `Loop(...)` stage of its walks).

A model supplies:
  - a `Denoiser`: `predict(items) -> outputs`, one model output (e.g. flow velocity) per item,
    called ONCE per step with every (request, label) of the batch: the cross-request packed step;
  - `start(request) -> DenoiseStart`: initial latents (seeded noise), the request's sampler, its
    guidance and token count, and any per-request conditioning the denoiser reads;
  - `text(request, label) -> Tensor`: that label's text embeddings from `request.tensors`.

    node = DenoiseNode("dit", WanDenoiser(dit, attn), start=wan_start, text=wan_text)
    # per step the worker calls node.forward(batch); check_stop(request) is true after the last step;
    # the final latents land in request.tensors[node.output_tensor] (or the `finish` hook's choice).

With guidance each request contributes two items, labels "cond" and "uncond", combined per request
by `combine_guidance` (default: uncond + scale * (cond - uncond), as Wan and most pipelines do), in
the dtype the denoiser returns; the sampler gets that tensor and promotes it as diffusers does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mstar.graph import Node, RequestState

COND, UNCOND = "cond", "uncond"


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
    """One (request, label) of a packed step, as the Denoiser sees it."""

    request_id: str
    label: str  # COND or UNCOND
    latents: torch.Tensor  # current sample, float32, the model's latent layout (e.g. [C, F, H, W])
    timestep: float  # sampler.timesteps[step_index], the model's timestep input scale
    sigma: float  # sampler.sigmas[step_index]
    step_index: int
    text: Any  # this label's text embeddings (whatever the `text` hook returns)
    condition: dict[str, Any]  # DenoiseStart.condition of the request


def kept_per_label(item: DenoiseItem, key: str, compute: Callable[[], Any]) -> Any:
    """A value computed at the request's first step for this item's label and kept in the request's
    condition under `key` (label -> value) for its other steps; it leaves with the request. For work
    that depends on the text only (cross-attention keys/values, a refined caption)."""
    kept = item.condition.setdefault(key, {})
    if item.label not in kept:
        kept[item.label] = compute()
    return kept[item.label]


class Denoiser(Protocol):
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        """One output per item, shaped like item.latents, in the same order."""
        ...


@dataclass
class DenoiseStart:
    """What a request starts its loop with (built by the model's `start` hook in prepare)."""

    latents: torch.Tensor  # float32 initial sample
    sampler: Sampler
    num_tokens: int  # tokens one label adds to a step (step_cost counts both labels)
    guidance_scale: float = 1.0
    use_guidance: bool = False  # run the "uncond" label and combine
    condition: dict[str, Any] = field(default_factory=dict)


@dataclass
class DenoiseState:
    """request.state[node.name] while the request is in the loop."""

    latents: torch.Tensor
    sampler: Sampler
    num_tokens: int
    guidance_scale: float
    labels: tuple[str, ...]
    condition: dict[str, Any]


def cfg_combine(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Classifier-free guidance: uncond + scale * (cond - uncond)."""
    return uncond + scale * (cond - uncond)


class DenoiseNode(Node):
    """Loop node: per request a sampler, latents and step index; one packed predict per step."""

    def __init__(
        self,
        name: str,
        denoiser: Denoiser,
        start: Callable[[RequestState], DenoiseStart],
        text: Callable[[RequestState, str], Any],
        finish: Callable[[RequestState, torch.Tensor], None] | None = None,
        output_tensor: str = "latents",
        combine_guidance: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = cfg_combine,
        max_batch_size: int = 8,
        max_step_cost: int | None = None,
    ):
        self.name = name
        self.denoiser = denoiser
        self._start = start
        self._text = text
        self._finish = finish
        self.output_tensor = output_tensor
        self._combine = combine_guidance
        self.max_batch_size = max_batch_size
        self.max_step_cost = max_step_cost

    def prepare(self, request: RequestState) -> None:
        start = self._start(request)
        labels = (COND, UNCOND) if start.use_guidance else (COND,)
        cost = start.num_tokens * len(labels)
        if self.max_step_cost is not None and cost > self.max_step_cost:
            # The API refuses these at validation; a step above the cap is what boot sizing excludes.
            raise ValueError(
                f"the request needs {cost} tokens per step, above max_tokens_per_step={self.max_step_cost}"
            )
        request.state[self.name] = DenoiseState(
            latents=start.latents.to(torch.float32),
            sampler=start.sampler,
            num_tokens=start.num_tokens,
            guidance_scale=float(start.guidance_scale),
            labels=labels,
            condition=start.condition,
        )

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
        outputs = iter(self.denoiser.predict(items))
        for request, state in zip(batch, states, strict=True):
            per_label = {label: next(outputs) for label in state.labels}
            # In the denoiser's output dtype (bf16 for a bf16 DiT): the pipelines guide and hand the
            # scheduler that tensor, and its rounding is part of what they compute.
            guided = per_label[COND]
            if UNCOND in per_label:
                guided = self._combine(guided, per_label[UNCOND], state.guidance_scale)
            state.latents = state.sampler.step(guided, state.latents)
            if state.sampler.done:
                self._store(request, state)

    def _item(self, request: RequestState, state: DenoiseState, label: str) -> DenoiseItem:
        index = state.sampler.step_index
        return DenoiseItem(
            request_id=request.request_id,
            label=label,
            latents=state.latents,
            timestep=float(state.sampler.timesteps[index]),
            sigma=float(state.sampler.sigmas[index]),
            step_index=index,
            text=self._text(request, label),
            condition=state.condition,
        )

    def _store(self, request: RequestState, state: DenoiseState) -> None:
        if self._finish is not None:
            self._finish(request, state.latents)
        else:
            request.tensors[self.output_tensor] = state.latents

    def check_stop(self, request: RequestState) -> bool:
        state = request.state.get(self.name)
        return state is not None and state.sampler.done

    def progress(self, request: RequestState) -> tuple[int, int] | None:
        state = request.state.get(self.name)
        if state is None:
            return None
        return state.sampler.step_index, state.sampler.num_steps
