"""RaggedAttention: per label, a ring of plan slots; plan once per step, run in every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mstar.engine.attention.backends import AttentionBackend
from mstar.engine.attention.layout import AnyLayout, AttentionLayout
from mstar.engine.attention.op import register_instance
from mstar.engine.attention.wrapper import PlanWrapper

DEFAULT_NUM_SLOTS = 2


@dataclass
class _LabelSlots:
    wrappers: list[PlanWrapper]
    active: int | None = None  # the slot run() uses
    name: str = field(default="")


class RaggedAttention:
    """One attention resource: `plan(label, layout)` once per step, `run(label, q, k, v)` per layer.

    Each label ("self", "cross", ...) owns `num_slots` wrappers of the backend. plan() reuses the
    slot that already holds the layout (no work at all) or fills the next slot and makes it
    active, so the step the device still runs keeps its plan while the host plans the next one
    (the step loop queues step N+1 before step N ends).
    """

    def __init__(
        self,
        backend: AttentionBackend,
        device: torch.device,
        dtype: torch.dtype,
        workspace: torch.Tensor | None = None,
        num_slots: int = DEFAULT_NUM_SLOTS,
        cuda_graph: bool = False,
    ) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.backend = backend
        self.backend_name = backend.name
        self.device = device
        self.dtype = dtype
        self.workspace = workspace
        self.num_slots = num_slots
        self.cuda_graph = cuda_graph
        self._slots_by_label: dict[str, _LabelSlots] = {}
        self._label_ids: dict[str, int] = {}
        self._slots_by_id: dict[int, _LabelSlots] = {}
        self._next_label_id = 0
        self._instance_id = register_instance(self)

    def __repr__(self) -> str:
        return f"RaggedAttention(backend={self.backend.version!r}, device={self.device}, dtype={self.dtype})"

    # ---- planning (host side, once per step) ----

    def plan(self, label: str, layout: AnyLayout) -> None:
        """Make `layout` the plan run(label, ...) uses from now on."""
        slots = self._slots(label)
        target = self._slot_holding(slots, layout)
        if target is None:
            target = self._next_slot(slots)
        slots.active = None  # a plan that raises leaves the label unplanned, not stale
        slots.wrappers[target].plan(layout)
        slots.active = target

    def discard(self, label: str) -> None:
        """Remove a label with its wrappers and plans (the boot check's label, for one)."""
        if self._slots_by_label.pop(label, None) is not None:
            del self._slots_by_id[self._label_ids.pop(label)]

    # ---- running (every layer; traceable) ----

    def run(self, label: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Tq, H, D], k [Tkv, Hkv, D], v [Tkv, Hkv, Dv], packed segment after segment -> [Tq, H, Dv].

        Inputs are cast to the resource dtype (the one checked at boot; a no-op when they match),
        so the output has that dtype.
        """
        label_id = self._label_ids.get(label)
        if label_id is None:
            raise RuntimeError(f"attention label '{label}' was never planned; call plan() first")
        q, k, v = q.to(self.dtype), k.to(self.dtype), v.to(self.dtype)
        return torch.ops.mstar.ragged_attention(q, k, v, self._instance_id, label_id)

    def run_active(self, label_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The eager body of the custom op: the label's active wrapper runs the kernel."""
        slots = self._slots_by_id.get(label_id)
        if slots is None:
            raise RuntimeError(f"attention label id {label_id} was discarded")
        if slots.active is None:
            raise RuntimeError(
                f"attention label '{slots.name}' has no plan (never planned, or its plan failed)"
            )
        # contiguous, as the fake impl promises the compiler (a no-op for every kernel we know)
        return slots.wrappers[slots.active].run(q, k, v).contiguous()

    # ---- introspection (tests, benchmarks, metrics) ----

    def labels(self) -> list[str]:
        return list(self._slots_by_label)

    def wrappers(self, label: str) -> list[PlanWrapper]:
        return list(self._slots(label).wrappers)

    def active_slot(self, label: str) -> int | None:
        return self._slots(label).active

    @property
    def num_kernel_plans(self) -> int:
        return sum(w.num_kernel_plans for s in self._slots_by_id.values() for w in s.wrappers)

    # ---- internals ----

    def _slots(self, label: str) -> _LabelSlots:
        slots = self._slots_by_label.get(label)
        if slots is None:
            captured = self.cuda_graph
            wrappers = [self.backend.make_wrapper(captured) for _ in range(self.num_slots)]
            slots = _LabelSlots(wrappers=wrappers, name=label)
            self._slots_by_label[label] = slots
            self._label_ids[label] = self._next_label_id
            self._slots_by_id[self._next_label_id] = slots
            self._next_label_id += 1
        return slots

    def _slot_holding(self, slots: _LabelSlots, layout: AnyLayout) -> int | None:
        for index, wrapper in enumerate(slots.wrappers):
            if _holds(wrapper, layout):
                return index
        return None

    def _next_slot(self, slots: _LabelSlots) -> int:
        return 0 if slots.active is None else (slots.active + 1) % self.num_slots


def _holds(wrapper: PlanWrapper, layout: AnyLayout) -> bool:
    """Only host layouts can match; a device layout is never compared."""
    return isinstance(layout, AttentionLayout) and wrapper.planned_layout == layout
