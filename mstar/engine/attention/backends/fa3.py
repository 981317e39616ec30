"""FlashAttention-3 (package fa3-fwd, module fa3_fwd_interface): the fastest kernel on Hopper."""

from __future__ import annotations

from typing import Any

import torch

from mstar.engine.attention.layout import AnyLayout
from mstar.engine.attention.wrapper import PlanWrapper, check_tokens

FA3_PACKAGE = "fa3-fwd"
FA3_MODULE = "fa3_fwd_interface"
FA3_DTYPES = (torch.bfloat16,)  # fa3-fwd is built without fp16 and FA3 has no fp32 kernels


class FA3Backend:
    name = "fa3"

    def __init__(self, device: torch.device, library: Any, library_version: str) -> None:
        self.device = device
        self.version = f"{FA3_PACKAGE} {library_version}"
        self.varlen = library.flash_attn_varlen_func

    def make_wrapper(self, captured: bool) -> PlanWrapper:
        return FA3Wrapper(self.device, captured, self.varlen)


class FA3Wrapper(PlanWrapper):
    def __init__(self, device: torch.device, captured: bool, varlen: Any) -> None:
        super().__init__(device, captured)
        self._varlen = varlen
        self._layout: AnyLayout | None = None
        self._cu_q: torch.Tensor | None = None
        self._cu_kv: torch.Tensor | None = None

    def _plan_kernel(self, layout: AnyLayout) -> None:
        # FA3 schedules inside the kernel; its plan is the staged offsets plus the host maxima
        self._cu_q, self._cu_kv = self.stage_offsets(layout)
        self._layout = layout

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        layout = self._layout
        assert layout is not None, "run before plan"
        check_tokens(q, k, layout, "fa3")
        out = self._varlen(
            q,
            k,
            v,
            self._cu_q,
            self._cu_kv,
            layout.max_q_len,
            layout.max_kv_len,
            causal=layout.causal,
        )
        # some fa3 builds return (out, softmax_lse)
        return out[0] if isinstance(out, tuple) else out
