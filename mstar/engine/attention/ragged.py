"""Minimal first version: torch backend only (SDPA per segment). Replaced by the full backends."""

from __future__ import annotations

import torch

from mstar.engine.attention.layout import AttentionLayout
from mstar.engine.attention.reference import reference_attention


class RaggedAttention:
    """plan(label, layout) once per step, run(label, q, k, v) in every layer."""

    def __init__(self, backend_name: str, device: torch.device, dtype: torch.dtype) -> None:
        self.backend_name = backend_name
        self.device = device
        self.dtype = dtype
        self._layouts: dict[str, AttentionLayout] = {}

    def plan(self, label: str, layout: AttentionLayout) -> None:
        self._layouts[label] = layout

    def run(self, label: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if label not in self._layouts:
            raise RuntimeError(f"attention label '{label}' was never planned")
        return reference_attention(q, k, v, self._layouts[label])


def build_attention(
    backend: str = "auto",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    flashinfer_backend: str = "auto",
    workspace_mb: int = 512,
) -> RaggedAttention:
    if backend not in ("auto", "torch"):
        raise ValueError(f"attention backend '{backend}' is not available yet (device {device})")
    return RaggedAttention("torch", torch.device(device), dtype)
