"""Counted FLOPs of one DiT forward, and the roofline time they imply (the arithmetic every family's
bench entry counts its model with; torch-free).

A GEMM of [M, K] x [K, N] costs 2*M*N*K FLOPs. Attention of Tq queries over Tkv keys with H heads of
size D costs 2*Tq*Tkv*H*D for QK^T plus the same for PV. Each packed segment attends only to itself
(ragged attention), so attention is summed per segment, never over the packed length.
Element-wise work (norms, rotary, modulation, softmax) is left out: it is bandwidth, not FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

# Measured on an H200: bf16 GEMM at DiT shapes (777-794 TFLOP/s) and fa3 varlen attention (664).
GEMM_CEILING_FLOPS = 780e12
ATTENTION_CEILING_FLOPS = 660e12


@dataclass(frozen=True)
class FlopCount:
    gemm: float
    attention: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention

    def roofline_s(
        self, gemm_ceiling: float = GEMM_CEILING_FLOPS, attention_ceiling: float = ATTENTION_CEILING_FLOPS
    ) -> float:
        """The shortest time this work could take on the GPU: each part at its measured ceiling."""
        return self.gemm / gemm_ceiling + self.attention / attention_ceiling

    def __add__(self, other: FlopCount) -> FlopCount:
        return FlopCount(self.gemm + other.gemm, self.attention + other.attention)

    def __mul__(self, factor: float) -> FlopCount:
        return FlopCount(self.gemm * factor, self.attention * factor)


ZERO = FlopCount(0.0, 0.0)


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def attention_flops(q_len: int, kv_len: int, num_heads: int, head_dim: int) -> float:
    return 2 * 2.0 * q_len * kv_len * num_heads * head_dim  # QK^T and PV


@dataclass(frozen=True)
class BlockShape:
    """The numbers of a transformer block that set its FLOPs."""

    dim: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    num_ffn_matrices: int  # 2 for GELU MLPs, 3 for SwiGLU

    def self_block(self, num_tokens: int) -> FlopCount:
        """QKV + out projections, self attention, FFN over one segment of `num_tokens`."""
        projections = 4 * gemm_flops(num_tokens, self.dim, self.dim)
        ffn = self.num_ffn_matrices * gemm_flops(num_tokens, self.ffn_dim, self.dim)
        return FlopCount(
            projections + ffn, attention_flops(num_tokens, num_tokens, self.num_heads, self.head_dim)
        )

    def cross_attention(self, num_queries: int, num_keys: int) -> FlopCount:
        """Q/out on the queries' tokens, K/V on the keys' tokens, then attention."""
        projections = 2 * gemm_flops(num_queries, self.dim, self.dim) + 2 * gemm_flops(
            num_keys, self.dim, self.dim
        )
        return FlopCount(projections, attention_flops(num_queries, num_keys, self.num_heads, self.head_dim))
