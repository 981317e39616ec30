"""Seeded noise for sampling, computed on the device from (seed, output index, vocabulary id).

A request's i-th sampled token sees the same uniforms whatever else rides in the step, whether it
was preempted and recomputed, and on CPU and CUDA alike: each uniform is a hash of its counters,
not a draw from a stateful generator (which would depend on the batch). The hash is Wellons'
"lowbias32" on 32-bit values held in int64 tensors (masked after every multiply, so the wrap of a
64-bit product never matters and right shifts only ever see non-negative values).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
MUL_A, MUL_B = 0x7FEB352D, 0x846CA68B
GOLDEN = 0x9E3779B9


def mix32(x: int) -> int:
    """lowbias32 on a Python int (the host side of the same hash)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * MUL_A) & MASK32
    x ^= x >> 15
    x = (x * MUL_B) & MASK32
    return x ^ (x >> 16)


def row_key(seed: int, index: int) -> int:
    """The 32-bit key of a request's `index`-th sampled token (seed up to 2**63)."""
    key = mix32(seed & MASK32)
    key = mix32(key ^ (seed >> 32) ^ GOLDEN)
    return mix32(key ^ (index & MASK32))


def mix32_tensor(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 elementwise on an int64 tensor of values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * MUL_A) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL_B) & MASK32
    return x ^ (x >> 16)


class VocabNoise:
    """Uniforms in (0, 1) for rows of keys over the whole vocabulary: [rows, vocab] float32."""

    def __init__(self, vocab_size: int, device: torch.device):
        ids = torch.arange(vocab_size, dtype=torch.int64, device=device)
        self.vocab_hashes = mix32_tensor((ids * GOLDEN) & MASK32)  # [vocab], once

    def uniform(self, keys: torch.Tensor) -> torch.Tensor:
        """keys int64 [rows] (row_key values) -> float32 [rows, vocab] in (0, 1)."""
        return uniforms(keys, self.vocab_hashes)


def uniforms(keys: torch.Tensor, vocab_hashes: torch.Tensor) -> torch.Tensor:
    """keys int64 [rows], vocab_hashes int64 [vocab] (VocabNoise's) -> float32 [rows, vocab]."""
    x = mix32_tensor(keys[:, None] ^ vocab_hashes[None, :])
    x = mix32_tensor(x ^ GOLDEN)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
