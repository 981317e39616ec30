"""Attention backends: each supplies a PlanWrapper subclass; the plan cache lives in the base."""

from __future__ import annotations

from typing import Protocol

import torch

from mstar.engine.attention.wrapper import PlanWrapper


class AttentionBackend(Protocol):
    name: str  # "fa3" | "flashinfer" | "torch"
    version: str  # the library that runs the kernels, e.g. "fa3-fwd 0.0.3"

    def make_wrapper(self, captured: bool) -> PlanWrapper: ...


__all__ = ["AttentionBackend", "PlanWrapper", "torch"]
