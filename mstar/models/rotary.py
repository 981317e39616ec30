"""Rotary embeddings' feature order, shared by the DiTs whose checkpoints rotate interleaved pairs.

Checkpoints store each head's rotary pairs interleaved (0, 1), (2, 3), ...; rotating them reads
every other element. After loading, the query and key projections can be permuted so each head
holds its pairs as halves (evens first, then odds): rotation then reads two contiguous halves.
Attention scores are dot products over each head, the same in any common feature order, so only
queries and keys move; values (and so the output) keep theirs.
"""

from __future__ import annotations

import torch


def halves_order(num_heads: int, head_dim: int) -> torch.Tensor:
    """Feature order [H * D] that puts each head's interleaved pairs as halves: (0, 2, .., 1, 3, ..)."""
    within_head = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
    return (torch.arange(num_heads)[:, None] * head_dim + within_head[None, :]).flatten()
