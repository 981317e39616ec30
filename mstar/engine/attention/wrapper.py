"""The plan cache every backend shares: one wrapper per (label, slot) keeps its last host layout."""

from __future__ import annotations

import torch

from mstar.engine.attention.layout import AnyLayout, AttentionLayout, DeviceLayout
from mstar.engine.attention.staging import IndexStager


class PlanWrapper:
    """Base of every backend's wrapper. Subclasses implement `_plan_kernel` and `run`.

    Rules kept here so that no backend can skip them:
    - planning the host layout this wrapper last planned returns before any work;
    - a DeviceLayout always plans (comparing it would sync the stream);
    - the remembered layout is cleared before the kernel plan, so a plan that raises leaves
      nothing to reuse;
    - causality is part of the layout, hence of the key.
    """

    def __init__(self, device: torch.device, captured: bool = False) -> None:
        self.device = device
        self.captured = captured
        self.stager = IndexStager(device, captured=captured)
        self.planned_layout: object | None = None
        self.num_kernel_plans = 0

    def plan(self, layout: AnyLayout) -> bool:
        """Make this wrapper ready to run `layout`; returns False when the last plan is reused."""
        if self.is_host_layout(layout) and layout == self.planned_layout:
            return False
        self.planned_layout = None
        self._plan_kernel(layout)
        self.num_kernel_plans += 1
        if self.is_host_layout(layout):
            self.planned_layout = layout
        return True

    def is_host_layout(self, layout: object) -> bool:
        """Layouts described on the host (comparable without a sync); subclasses over other layout
        types (the KV pool's paged layouts) name theirs."""
        return isinstance(layout, AttentionLayout)

    def forget(self) -> None:
        """The next plan of any layout does the work again (a dropped pre-plan)."""
        self.planned_layout = None

    def _plan_kernel(self, layout: AnyLayout) -> None:
        raise NotImplementedError

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [Tq, H, D], k [Tkv, Hkv, D], v [Tkv, Hkv, Dv] -> out [Tq, H, Dv]."""
        raise NotImplementedError

    def stage_offsets(self, layout: AnyLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Device int32 cu_seqlens (q, kv) for the layout, copied once here (not per layer)."""
        if isinstance(layout, DeviceLayout):
            if not self.captured:
                return layout.cu_seqlens_q, layout.cu_seqlens_kv
            # a captured wrapper reads its own buffers: copy device -> device into them
            self.stager.reserve(layout.num_segments)
            cu_q, cu_kv = self.stager.device_views()
            cu_q.copy_(layout.cu_seqlens_q, non_blocking=True)
            cu_kv.copy_(layout.cu_seqlens_kv, non_blocking=True)
            return cu_q, cu_kv
        self.stager.write_host(layout.cu_seqlens_q(), layout.cu_seqlens_kv())
        return self.stager.copy_to_device()


def check_tokens(q: torch.Tensor, k: torch.Tensor, layout: AnyLayout, backend: str) -> None:
    """Shapes are host metadata: checking them costs no sync."""
    if q.shape[0] != layout.total_q or k.shape[0] != layout.total_kv:
        raise ValueError(
            f"{backend} attention: q has {q.shape[0]} tokens and k {k.shape[0]}, "
            f"the planned layout has {layout.total_q} and {layout.total_kv}"
        )
