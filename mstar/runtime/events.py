"""What a RequestHandle yields: progress of Loop nodes, pieces of the outputs the caller asked to
stream, then exactly one Done or Failed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mstar.errors import FailureKind


@dataclass(frozen=True)
class Progress:
    step: int
    total: int


@dataclass(frozen=True)
class Piece:
    """The next piece (axis 0, in order) of a streamed output: a clip's frames as they are decoded,
    or a JSON-able value a node sent inline (a text model's tokens of one step)."""

    key: str
    index: int
    value: np.ndarray | Any


@dataclass(frozen=True)
class Done:
    # The final walk's outputs, e.g. "frames": uint8 [F, H, W, 3]. An output the caller streamed
    # (Runtime.submit's stream_outputs) is absent when the model sent it in pieces: they came as
    # Piece events. An output sent in pieces that the caller did not stream is joined here.
    outputs: dict[str, np.ndarray]


@dataclass(frozen=True)
class Failed:
    message: str
    kind: FailureKind


Event = Progress | Piece | Done | Failed
