"""PyTorch backend: varlen_attn (FlashAttention-2) on CUDA in half precision, SDPA per segment otherwise."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from mstar.engine.attention.layout import AnyLayout, AttentionLayout, DeviceLayout
from mstar.engine.attention.reference import reference_attention
from mstar.engine.attention.wrapper import PlanWrapper, check_tokens

VARLEN_DTYPES = (torch.float16, torch.bfloat16)


def load_varlen_attn() -> Callable[..., torch.Tensor] | None:
    """torch.nn.attention.varlen.varlen_attn when this torch has it (2.10+)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_causal_kwargs(varlen: Callable[..., Any], causal: bool) -> dict[str, Any]:
    """torch 2.10 takes is_causal; 2.11+ spells causal as window_size=(-1, 0)."""
    parameters = inspect.signature(varlen).parameters
    if "window_size" in parameters:
        return {"window_size": (-1, 0)} if causal else {}
    return {"is_causal": causal}


def varlen_takes_gqa(varlen: Callable[..., Any]) -> bool:
    """Whether this torch's varlen_attn reads fewer key/value heads than query heads (enable_gqa)."""
    return "enable_gqa" in inspect.signature(varlen).parameters


class TorchBackend:
    name = "torch"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.version = f"torch {torch.__version__}"
        self.varlen = load_varlen_attn() if device.type == "cuda" else None

    def make_wrapper(self, captured: bool) -> PlanWrapper:
        return TorchWrapper(self.device, captured, self.varlen)


class TorchWrapper(PlanWrapper):
    def __init__(
        self, device: torch.device, captured: bool, varlen: Callable[..., torch.Tensor] | None
    ) -> None:
        super().__init__(device, captured)
        self._varlen = varlen
        self._layout: AnyLayout | None = None
        self._host_layout: AttentionLayout | None = None
        self._cu_q: torch.Tensor | None = None
        self._cu_kv: torch.Tensor | None = None
        self._causal_kwargs: dict[str, Any] = {}
        self._takes_gqa = varlen is not None and varlen_takes_gqa(varlen)

    def _plan_kernel(self, layout: AnyLayout) -> None:
        self._layout = layout
        self._host_layout = layout if isinstance(layout, AttentionLayout) else None
        if self._varlen is not None:
            self._cu_q, self._cu_kv = self.stage_offsets(layout)
            self._causal_kwargs = varlen_causal_kwargs(self._varlen, layout.causal)
        elif isinstance(layout, DeviceLayout):
            # SDPA per segment slices on the host: read the offsets back once, here, not per layer
            self._host_layout = layout.to_host_layout()

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        layout = self._layout
        assert layout is not None, "run before plan"
        check_tokens(q, k, layout, "torch")
        if self._varlen is not None and q.is_cuda and q.dtype in VARLEN_DTYPES:
            kwargs = dict(self._causal_kwargs)
            if q.shape[1] != k.shape[1]:  # grouped-query attention
                if self._takes_gqa:
                    kwargs["enable_gqa"] = True
                else:
                    groups = q.shape[1] // k.shape[1]
                    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            return self._varlen(
                q, k, v, self._cu_q, self._cu_kv, layout.max_q_len, layout.max_kv_len, **kwargs
            )
        if self._host_layout is None:
            assert isinstance(layout, DeviceLayout)
            self._host_layout = layout.to_host_layout()
        return reference_attention(q, k, v, self._host_layout)
