"""What a RequestHandle yields: progress of Loop nodes, then exactly one Done or Failed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FAILURE_KINDS = ("error", "aborted", "timeout", "worker_died", "out_of_memory")


@dataclass(frozen=True)
class Progress:
    step: int
    total: int


@dataclass(frozen=True)
class Done:
    outputs: dict[str, np.ndarray]  # the final walk's outputs, e.g. "frames": uint8 [F, H, W, 3]


@dataclass(frozen=True)
class Failed:
    message: str
    kind: str  # one of FAILURE_KINDS


Event = Progress | Done | Failed
