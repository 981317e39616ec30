"""Dense attention over a shared prefix plus each segment's own tokens (a DiT's generation pathway).

Segment i of a packed forward has q_lens[i] queries; they attend, without a mask, to the
prefix_lens[i] keys of its prefix (computed once per request and label and kept elsewhere) and
then to the segment's own q_lens[i] keys. One forward:

    dense = PrefixAttention(build_attention("auto", device, dtype))
    dense.plan("generation", PrefixLayout(prefix_lens=(31, 29), q_lens=(960, 960)), prefix)
    out = dense.run("generation", layer, q, k, v)   # q [Tq, H, D], k/v [Tq, Hkv, D] -> [Tq, H, D]
    dense.release("generation")                     # the forward is over: let go of the prefix

plan() runs once per forward: the ragged kernel plan of (q_lens, prefix_lens + q_lens) through the
plan cache every backend shares (fa3 -> FlashInfer -> torch, chosen at boot), and the index that
lays each segment's prefix and own keys side by side, built on the host and copied to the device
once. run() in every layer gathers that layer's prefix (`PrefixKV.layer`), places prefix and own
keys with the staged index and runs the ragged kernel. The same host layout planned again reuses
the index (no copy); a plan that raises leaves the label unplanned.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from mstar.engine.attention.layout import AttentionLayout
from mstar.engine.attention.ragged import RaggedAttention
from mstar.engine.transfer import to_device


@dataclass(frozen=True)
class PrefixLayout:
    """Per segment: prefix tokens, then the segment's own tokens (its queries). Hashable."""

    prefix_lens: tuple[int, ...]
    q_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix_lens", tuple(int(n) for n in self.prefix_lens))
        object.__setattr__(self, "q_lens", tuple(int(n) for n in self.q_lens))
        if len(self.prefix_lens) != len(self.q_lens):
            raise ValueError(
                f"PrefixLayout: {len(self.prefix_lens)} prefixes but {len(self.q_lens)} query segments"
            )
        if not self.q_lens:
            raise ValueError("PrefixLayout: needs at least one segment")
        if min(self.q_lens) < 1 or min(self.prefix_lens) < 0:
            raise ValueError(f"PrefixLayout: bad segment lengths {self}")

    @property
    def total_prefix(self) -> int:
        return sum(self.prefix_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    def kv_layout(self) -> AttentionLayout:
        """The ragged layout the kernels run: segment i's keys are its prefix then its own tokens."""
        kv_lens = tuple(p + q for p, q in zip(self.prefix_lens, self.q_lens, strict=True))
        return AttentionLayout(q_lens=self.q_lens, kv_lens=kv_lens, causal=False)

    def key_positions(self) -> list[int]:
        """Where each key lands in the ragged keys: the packed prefix rows first, then the own rows
        (int positions, [total_prefix + total_q])."""
        prefix_positions: list[int] = []
        own_positions: list[int] = []
        start = 0
        for prefix_len, q_len in zip(self.prefix_lens, self.q_lens, strict=True):
            prefix_positions.extend(range(start, start + prefix_len))
            own_positions.extend(range(start + prefix_len, start + prefix_len + q_len))
            start += prefix_len + q_len
        return prefix_positions + own_positions


class PrefixKV(Protocol):
    """The prefixes of one forward's segments, per layer, packed segment after segment."""

    prefix_lens: tuple[int, ...]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of layer `index`, each [sum(prefix_lens), Hkv, D]."""
        ...


class StackedPrefixKV:
    """Prefixes held as plain tensors: one [num_layers, 2, L_i, Hkv, D] per segment (index 0 keys,
    1 values), concatenated once here so every layer reads a view."""

    def __init__(self, per_segment: Sequence[torch.Tensor]):
        if not per_segment:
            raise ValueError("StackedPrefixKV needs at least one segment")
        shapes = {(t.dim(), t.shape[0], t.shape[1], *t.shape[3:]) for t in per_segment}
        if len(shapes) != 1 or next(iter(shapes))[:3] != (5, per_segment[0].shape[0], 2):
            raise ValueError(
                "prefix K/V must all be [num_layers, 2, L, Hkv, D] of one model, got "
                f"{[tuple(t.shape) for t in per_segment]}"
            )
        self.prefix_lens = tuple(int(t.shape[2]) for t in per_segment)
        self.kv = per_segment[0] if len(per_segment) == 1 else torch.cat(list(per_segment), dim=2)

    @property
    def num_layers(self) -> int:
        return int(self.kv.shape[0])

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv[index, 0], self.kv[index, 1]


@dataclass
class _LabelPlan:
    label: str
    layout: PrefixLayout | None = None
    positions: torch.Tensor | None = None  # int64 [total_prefix + total_q] on the device
    prefix: PrefixKV | None = field(default=None, repr=False)


_instances: weakref.WeakValueDictionary[int, PrefixAttention] = weakref.WeakValueDictionary()
_next_id = itertools.count(1)


class PrefixAttention:
    """The dense attention resource: plan(label, layout, prefix) per forward, run(label, layer, ...)
    per layer. Built on a RaggedAttention (its backend, slots and plan cache)."""

    def __init__(self, ragged: RaggedAttention) -> None:
        self.ragged = ragged
        self.device = ragged.device
        self.dtype = ragged.dtype
        self.num_index_copies = 0  # host -> device copies of the key positions (one per new layout)
        self._plans: dict[str, _LabelPlan] = {}
        self._plans_by_id: dict[int, _LabelPlan] = {}
        self._label_ids: dict[str, int] = {}
        self._instance_id = next(_next_id)
        _instances[self._instance_id] = self

    def __repr__(self) -> str:
        return f"PrefixAttention({self.ragged!r})"

    def plan(self, label: str, layout: PrefixLayout, prefix: PrefixKV) -> None:
        """Make `layout` with `prefix` what run(label, ...) uses until the next plan or release."""
        if tuple(prefix.prefix_lens) != layout.prefix_lens:
            raise ValueError(
                f"prefix attention '{label}': the prefixes hold {tuple(prefix.prefix_lens)} tokens, "
                f"the layout {layout.prefix_lens}"
            )
        state = self._state(label)
        state.prefix = None  # a plan that raises leaves the label unplanned, not stale
        self.ragged.plan(label, layout.kv_layout())
        if state.layout != layout:
            state.layout = None
            positions = torch.tensor(layout.key_positions(), dtype=torch.int64)
            state.positions = to_device(positions, self.device)
            self.num_index_copies += 1
            state.layout = layout
        state.prefix = prefix

    def release(self, label: str) -> None:
        """The forward is done: drop the prefix (its memory may go); the layout's index stays."""
        state = self._plans.get(label)
        if state is not None:
            state.prefix = None

    def run(self, label: str, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Tq, H, D], own k/v [Tq, Hkv, D] of layer `layer` -> [Tq, H, Dv] (resource dtype)."""
        label_id = self._label_ids.get(label)
        if label_id is None:
            raise RuntimeError(f"prefix attention label '{label}' was never planned; call plan() first")
        q, k, v = q.to(self.dtype), k.to(self.dtype), v.to(self.dtype)  # as RaggedAttention.run
        return torch.ops.mstar.prefix_attention(q, k, v, self._instance_id, label_id, layer)

    def run_active(
        self, label_id: int, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """The eager body of the custom op: gather, place, run the ragged kernel."""
        state = self._plans_by_id[label_id]
        if state.prefix is None or state.layout is None or state.positions is None:
            raise RuntimeError(f"prefix attention label '{state.label}' has no plan (or was released)")
        layout = state.layout
        if q.shape[0] != layout.total_q or k.shape[0] != layout.total_q or v.shape[0] != layout.total_q:
            raise ValueError(
                f"prefix attention '{state.label}': q/k/v have {q.shape[0]}/{k.shape[0]}/{v.shape[0]} "
                f"tokens, the planned layout {layout.total_q}"
            )
        prefix_k, prefix_v = state.prefix.layer(layer)
        keys = _place(prefix_k, k, state.positions, layout.total_prefix)
        values = _place(prefix_v, v, state.positions, layout.total_prefix)
        return self.ragged.run(state.label, q, keys, values)

    def _state(self, label: str) -> _LabelPlan:
        state = self._plans.get(label)
        if state is None:
            state = _LabelPlan(label)
            label_id = len(self._label_ids)
            self._plans[label] = state
            self._plans_by_id[label_id] = state
            self._label_ids[label] = label_id
        return state


def _place(
    prefix: torch.Tensor, own: torch.Tensor, positions: torch.Tensor, total_prefix: int
) -> torch.Tensor:
    """[P, Hkv, D] prefix rows and [T, Hkv, D] own rows -> the ragged keys [P + T, Hkv, D]."""
    if prefix.shape[0] != total_prefix or prefix.shape[1:] != own.shape[1:]:
        raise ValueError(
            f"prefix attention: the prefix is {tuple(prefix.shape)}, expected [{total_prefix}, "
            f"{', '.join(str(n) for n in own.shape[1:])}]"
        )
    placed = own.new_empty((total_prefix + own.shape[0], *own.shape[1:]))
    placed.index_copy_(0, positions[:total_prefix], prefix.to(own.dtype))
    placed.index_copy_(0, positions[total_prefix:], own)
    return placed


@torch.library.custom_op("mstar::prefix_attention", mutates_args=())
def prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, instance_id: int, label_id: int, layer: int
) -> torch.Tensor:
    attention = _instances.get(instance_id)
    if attention is None:
        raise RuntimeError(f"mstar::prefix_attention: attention instance {instance_id} no longer exists")
    return attention.run_active(label_id, layer, q, k, v)


@prefix_attention.register_fake
def _prefix_attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, instance_id: int, label_id: int, layer: int
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))  # [Tq, H, Dv]
