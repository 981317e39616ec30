"""What the DiTs' packed forwards share: per-item rows that enter a compiled stack, and small
per-size caches (rotary tables, token maps) that repeat every step."""

from __future__ import annotations

from collections.abc import Callable, Hashable
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


def bounded_cache_get(cache: dict, key: Hashable, build: Callable[[], T], max_entries: int = 64) -> T:
    """cache[key], built on first use; the oldest entry leaves once `max_entries` are held. For
    per-size tables (rotary angles, token maps) that repeat every step: a handful of sizes at most."""
    if key not in cache:
        if len(cache) >= max_entries:
            cache.pop(next(iter(cache)))
        cache[key] = build()
    return cache[key]
