"""A DiT worker's per-request LoRA: the wrapped layers, the device LRU, and each step's rows.

    lora = attach_lora(dit, targets, config, rules)    # after optimize, before compile (None: no lora_dir)
    lora.acquire(request_id, params.lora)              # when the request is prepared: loads start
    lora.ready(request_id)                             # the batch planner's readiness hook
    lora.set_step("tokens", lengths, request_ids)      # per step, next to the attention plan
    with lora.only(request_id, "text"): ...            # a forward of one request's rows (its text)
    lora.release(request_id)                           # finished, failed or cancelled

A request with no adapters rides with the others: its segment applies the zero slot (adding an
exact 0), and a step where no request has any runs the base layers alone.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from mstar.adapters import LoraCatalog, LoraKeyRules
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.store import AdapterStore
from mstar.engine.lora.wrap import LoraLayers, LoraTarget
from mstar.params import LoraChoice

logger = logging.getLogger("mstar.engine.lora")


class AdapterLoadError(RuntimeError):
    """A request's adapter could not be loaded (a corrupt or mismatched file): that request fails."""


class LoraServing:
    def __init__(self, layers: LoraLayers, store: AdapterStore, max_per_request: int = 1):
        self.layers = layers
        self.store = store
        self.max_per_request = max_per_request
        self._warmup_width = 0  # while warming up: adapters every request applies (zero scale)
        self.device = store.device
        self.dtype = layers.layers[0].lora_a.dtype if layers.layers else torch.float32
        self.layouts = sorted({target.layout for target in layers.targets})

    @property
    def context(self):
        return self.layers.context

    def acquire(self, request_id: str, choices: Sequence[LoraChoice]) -> None:
        """The request's adapters start loading (off the step loop); none: nothing to do."""
        if choices:
            self.store.acquire(request_id, choices)

    def ready(self, request_id: str) -> bool:
        """Whether the request's adapters are resident (copying loaded ones into free slots now, at
        a step boundary). Raises AdapterLoadError when one cannot be loaded."""
        self.store.poll()
        status = self.store.status(request_id)
        if status.failed:
            raise AdapterLoadError(status.error)
        return status.ready

    def release(self, request_id: str) -> None:
        self.store.release(request_id)

    def adapters(self, request_id: str | None) -> list[tuple[int, float]]:
        """(slot, scale) of the request's adapters; [] for a request without any, and for None
        (rows no request owns: padding)."""
        if request_id is None:
            return []
        if self._warmup_width:
            return [(1, 0.0)] * self._warmup_width
        return self.store.adapters(request_id)

    @contextlib.contextmanager
    def warming(self) -> Iterator[list[int]]:
        """Boot warmup of the LoRA graphs: yields the widths (adapters per request) whose graphs
        differ (1, and any larger count: a dimension of size 1 is specialised, larger ones are
        dynamic); inside, set `warmup_width` to one of them and run the warmup items."""
        try:
            yield sorted({1, self.max_per_request})
        finally:
            self._warmup_width = 0
            self.clear()

    def warm(self, width: int) -> None:
        self._warmup_width = width

    def set_step(self, layout: str, lengths: Sequence[int], request_ids: Sequence[str | None]) -> None:
        """The step's rows of `layout`: segment i (lengths[i] rows) applies request_ids[i]'s
        adapters (None: none)."""
        adapters = [self.adapters(rid) for rid in request_ids]
        self.context.set(layout, LoraRows.build(lengths, adapters, self.device, self.dtype))

    @contextlib.contextmanager
    def only(self, request_id: str, *layouts: str) -> Iterator[None]:
        """Every row of `layouts` applies one request's adapters while the block runs (a forward of
        that request alone: its text through the cross-attention keys and values)."""
        rows = LoraRows.uniform(self.adapters(request_id), self.device, self.dtype)
        saved = {layout: self.context.layouts.get(layout) for layout in layouts}
        for layout in layouts:
            self.context.set(layout, rows)
        try:
            yield
        finally:
            for layout, previous in saved.items():
                self.context.set(layout, previous)

    def clear(self) -> None:
        self.context.clear()

    def close(self) -> None:
        self.store.close()


def attach_lora(
    model: nn.Module,
    targets: Callable[[nn.Module], list[LoraTarget]],
    config: Any,
    rules: LoraKeyRules,
    on_loaded: Callable[[], None] | None = None,
) -> LoraServing | None:
    """Wrap `model`'s LoRA targets (the family's, on the model as optimize left it) with
    `config.max_loras` slots of rank `config.max_lora_rank`, and start its store over
    `config.lora_dir`; None when the server has no lora_dir (the model stays as it was)."""
    if not getattr(config, "lora_dir", None):
        return None
    layers = LoraLayers(model, targets(model), num_slots=config.max_loras, max_rank=config.max_lora_rank)
    catalog = LoraCatalog(config.lora_dir, (rules,))
    store = AdapterStore(catalog, layers, rules, on_loaded=on_loaded)
    logger.info(
        "lora: %d layers wrapped, %d slots of rank %d, adapters from %s",
        len(layers.layers), config.max_loras, config.max_lora_rank, catalog.folder,
    )  # fmt: skip
    return LoraServing(layers, store, config.max_loras_per_request)
