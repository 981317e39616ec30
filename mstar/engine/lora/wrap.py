"""Wrap a loaded model's Linears with the segmented LoRA linear, and pack adapters into their slots.

The family says which of its modules take LoRA (`LoraTarget`s): each names a Linear of our model
and the diffusers modules whose adapter weights feed its output slices, in order (a fused to_qkv
has three), with the output-row order the fusion gave each slice (queries and keys stored in
rotary halves order). Wrap after the model is loaded, moved and fused, and before it is compiled.
Each wrapped Linear takes the path (paths.py) its target names, else the one the rule picks for its
shape; a path given to LoraLayers overrides both (tests, benchmarks).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from mstar.adapters import AdapterFileError
from mstar.engine.lora.linear import LoraContext, SegmentedLoraLinear
from mstar.engine.lora.paths import choose_path
from mstar.engine.lora.weights import ModuleLora


@dataclass(frozen=True)
class LoraSlice:
    """Output rows of a wrapped Linear that one diffusers module's LoRA updates.
    out_order: the source module's rows in the order the fused weight holds them (None: as is)."""

    source: str
    out_features: int
    out_order: torch.Tensor | None = None


@dataclass(frozen=True)
class LoraTarget:
    """A Linear of our model (its module path), its slices, and the row layout its input follows;
    many_rows: the layout holds a step's packed tokens (thousands of rows), where a per-step cost
    (the concat path's weight copy) is paid off; path: the LoRA path the family names for it (the
    "activation" path where the module consuming its output fuses the expand), None: the rule's."""

    module: str
    slices: tuple[LoraSlice, ...]
    layout: str = "tokens"
    many_rows: bool = False
    path: str | None = None


def linear_targets(
    model: nn.Module, names: Iterable[str] | None = None, layout: str = "tokens"
) -> list[LoraTarget]:
    """One-slice targets for Linears named as diffusers names them (an unfused model): `names`,
    or every Linear of the model."""
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    chosen = sorted(linears) if names is None else list(names)
    missing = [name for name in chosen if name not in linears]
    if missing:
        raise ValueError(f"not Linears of the model: {missing}")
    return [LoraTarget(n, (LoraSlice(n, linears[n].out_features),), layout) for n in chosen]


class LoraLayers:
    """The wrapped Linears of one model, `num_slots` adapters each (plus the zero slot 0)."""

    def __init__(
        self,
        model: nn.Module,
        targets: Iterable[LoraTarget],
        num_slots: int,
        max_rank: int,
        context: LoraContext | None = None,
        path: str | None = None,
    ):
        if num_slots < 1 or max_rank < 1:
            raise ValueError(f"num_slots and max_rank must be >= 1, got {num_slots}, {max_rank}")
        self.context = context or LoraContext()
        self.num_slots = num_slots
        self.max_rank = max_rank
        self.targets = list(targets)
        self.path = path  # None: each target's, else choose_path per Linear
        self.layers: list[SegmentedLoraLinear] = []
        self.sources: dict[str, tuple[int, int]] = {}  # diffusers module -> (layer, slice)
        for index, target in enumerate(self.targets):
            self.layers.append(self._wrap(model, target))
            for slice_index, piece in enumerate(target.slices):
                if piece.source in self.sources:
                    raise ValueError(f"module '{piece.source}' feeds two LoRA slices")
                self.sources[piece.source] = (index, slice_index)

    def _wrap(self, model: nn.Module, target: LoraTarget) -> SegmentedLoraLinear:
        parent_name, _, child = target.module.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        base = getattr(parent, child)
        if isinstance(base, SegmentedLoraLinear) or not isinstance(base, nn.Linear):
            raise ValueError(f"'{target.module}' is not a plain Linear (wrapped already?)")
        features = [piece.out_features for piece in target.slices]
        path = (
            self.path
            or target.path
            or choose_path(
                base.in_features,
                base.out_features,
                len(features),
                self.num_slots,
                self.max_rank,
                target.many_rows,
            )
        )
        layer = SegmentedLoraLinear(
            base, features, self.num_slots + 1, self.max_rank, self.context, target.layout, path
        )
        setattr(parent, child, layer)
        return layer

    @property
    def modules(self) -> set[str]:
        """The diffusers module names an adapter may update."""
        return set(self.sources)

    def pack(self, adapter: dict[str, ModuleLora], pin: bool = False) -> list[torch.Tensor]:
        """One slot's contents for every layer ([A, B_0, ...] per layer, the buffers' dtype, on the
        host; pinned for a non-blocking copy). Raises AdapterFileError for a module this model does
        not wrap, a shape that does not match, or a rank above max_rank."""
        unknown = sorted(set(adapter) - self.modules)
        if unknown:
            raise AdapterFileError(f"module '{unknown[0]}' is not one this model applies LoRA to")
        packed: list[torch.Tensor] = []
        for layer, target in zip(self.layers, self.targets, strict=True):
            a = torch.zeros(layer.lora_a.shape[1:], dtype=torch.float32)  # [in, J, R]
            bs = [torch.zeros(b.shape[1:], dtype=torch.float32) for b in layer.lora_b()]  # [R, out_j]
            for index, piece in enumerate(target.slices):
                lora = adapter.get(piece.source)
                if lora is not None:
                    self._check(piece, layer, lora)
                    up = lora.up if piece.out_order is None else lora.up[piece.out_order.cpu()]
                    a[:, index, : lora.rank] = lora.down.T
                    bs[index][: lora.rank] = up.T
            for tensor in [a, *bs]:
                host = tensor.to(layer.lora_a.dtype)
                packed.append(host.pin_memory() if pin else host)
        return packed

    def _check(self, piece: LoraSlice, layer: SegmentedLoraLinear, lora: ModuleLora) -> None:
        if lora.rank > self.max_rank:
            raise AdapterFileError(
                f"module '{piece.source}' has rank {lora.rank}, above max_lora_rank {self.max_rank}"
            )
        expected = (piece.out_features, layer.in_features)
        if (lora.up.shape[0], lora.down.shape[1]) != expected:
            raise AdapterFileError(
                f"module '{piece.source}': the adapter's update is {lora.up.shape[0]}x{lora.down.shape[1]}, "
                f"the model's is {expected[0]}x{expected[1]} (an adapter for another model size?)"
            )

    def write(self, slot: int, packed: list[torch.Tensor]) -> None:
        """Copy `pack`'s output into `slot` (1..num_slots), queued on the current stream."""
        self._check_slot(slot)
        buffers = [buffer for layer in self.layers for buffer in (layer.lora_a, *layer.lora_b())]
        if len(buffers) != len(packed):
            raise ValueError("packed contents are for another set of layers")
        with torch.no_grad():
            for buffer, host in zip(buffers, packed, strict=True):
                buffer[slot].copy_(host, non_blocking=True)

    def clear(self, slot: int) -> None:
        self._check_slot(slot)
        with torch.no_grad():
            for layer in self.layers:
                for buffer in (layer.lora_a, *layer.lora_b()):
                    buffer[slot].zero_()

    def _check_slot(self, slot: int) -> None:
        if not 1 <= slot <= self.num_slots:
            raise ValueError(f"slot must be in [1, {self.num_slots}], got {slot}")
