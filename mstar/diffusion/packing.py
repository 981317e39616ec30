"""Packing helpers: many items' tokens laid end to end in one tensor, and back.

A packed step concatenates every item's tokens along dim 0 ("segment after segment"); the
segment lengths travel on the host (they become an `AttentionLayout`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pack_segments(segments: Sequence[torch.Tensor]) -> tuple[torch.Tensor, tuple[int, ...]]:
    """[n_i, ...] tensors -> ([sum n_i, ...], (n_1, n_2, ...))."""
    lens = tuple(int(s.shape[0]) for s in segments)
    return torch.cat(list(segments), dim=0), lens


def unpack_segments(packed: torch.Tensor, lens: Sequence[int]) -> list[torch.Tensor]:
    """[sum n_i, ...] -> views [n_i, ...], one per segment."""
    return list(torch.split(packed, list(lens), dim=0))


def segment_index(lens: Sequence[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """Token -> segment index, int64 [sum n_i] (e.g. to gather a per-item table over packed tokens)."""
    counts = torch.tensor(list(lens), dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(lens), dtype=torch.int64), counts).to(device)
