"""Packing helpers: many items' tokens laid end to end in one tensor, and back.

A packed step concatenates every item's tokens along dim 0 ("segment after segment"); the
segment lengths travel on the host (they become an `AttentionLayout`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

# Per-item rows (timestep modulation) that enter a compiled layer stack: torch.compile specialises
# a dimension of size 1, so one item alone would compile a second graph at boot. Padding rows are
# never indexed by a token.
MIN_COMPILED_ROWS = 2


def pad_rows(rows: torch.Tensor, min_rows: int = MIN_COMPILED_ROWS) -> torch.Tensor:
    """rows [R, ...] with zero rows appended up to `min_rows` (unchanged when R >= min_rows)."""
    if rows.shape[0] >= min_rows:
        return rows
    return torch.cat([rows, rows.new_zeros(min_rows - rows.shape[0], *rows.shape[1:])])


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


def bounded_cache_get(cache: dict, key: Hashable, build: Callable[[], T], max_entries: int = 64) -> T:
    """cache[key], built on first use; the oldest entry leaves once `max_entries` are held. For
    per-size tables (rotary angles, token maps) that repeat every step: a handful of sizes at most."""
    if key not in cache:
        if len(cache) >= max_entries:
            cache.pop(next(iter(cache)))
        cache[key] = build()
    return cache[key]
