"""Layers of the LTX-2 DiT and its text connectors over packed tokens (state-dict keys as diffusers').

Every layer works on tokens [T, features] of many items laid end to end; attention runs on the
shared RaggedAttention under a label the caller planned (the packed segments). Per-item
conditioning arrives as rows [R, ...] and a token -> row index.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.diffusion.packing import pad_rows
from mstar.models.ltx2.rope import apply_rotary

TIMESTEP_FEATURES = 256  # PixArtAlphaCombinedTimestepSizeEmbeddings' sinusoid width


def timestep_sinusoid(timesteps: torch.Tensor, dim: int = TIMESTEP_FEATURES) -> torch.Tensor:
    """diffusers Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0): [R] -> [R, dim] float32."""
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=timesteps.device)
    frequencies = torch.exp(exponent / half)
    angles = timesteps[:, None].float() * frequencies[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class RMSNorm(nn.Module):
    """diffusers' RMSNorm: statistics in float32, optional weight (key `weight`)."""

    def __init__(self, dim: int, eps: float, elementwise_affine: bool = False):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + self.eps)
        if self.weight is None:
            return normed.to(x.dtype)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            normed = normed.to(self.weight.dtype)
        return normed * self.weight


class TimestepEmbedding(nn.Module):
    """linear_1 -> SiLU -> linear_2 (diffusers TimestepEmbedding)."""

    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class _TimestepEmbedder(nn.Module):
    """Holds `timestep_embedder` (the key path of PixArtAlphaCombinedTimestepSizeEmbeddings)."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(TIMESTEP_FEATURES, dim)


class AdaLayerNormSingle(nn.Module):
    """diffusers LTX2AdaLayerNormSingle: timestep -> (num_params * dim modulation, dim embedding)."""

    def __init__(self, dim: int, num_params: int):
        super().__init__()
        self.num_params = num_params
        self.emb = _TimestepEmbedder(dim)
        self.linear = nn.Linear(dim, num_params * dim)

    def rows(self, timesteps: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[R] timesteps -> (modulation [R', num_params, dim], embedding [R', dim]) in `dtype`, with
        zero rows appended up to R' = max(R, MIN_COMPILED_ROWS) (rows no token reads: a compiled
        stack would specialise a single row).

        One row at a time: BLAS picks its kernel by row count (gemv for one row), so computing
        rows together would make an item's output depend on how many items share its step."""
        sinusoid = timestep_sinusoid(timesteps).to(dtype)
        embedded = torch.cat([self.emb.timestep_embedder(row) for row in sinusoid.split(1)])
        modulation = torch.cat([self.linear(F.silu(row)) for row in embedded.split(1)])
        return pad_rows(modulation.unflatten(1, (self.num_params, -1))), pad_rows(embedded)


class GeluProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, bias: bool):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers FeedForward(activation_fn="gelu-approximate", mult=4): keys net.0.proj and net.2."""

    def __init__(self, dim: int, bias: bool = True, mult: int = 4):
        super().__init__()
        inner = dim * mult
        self.net = nn.ModuleList(
            [GeluProj(dim, inner, bias), nn.Dropout(0.0), nn.Linear(inner, dim, bias=bias)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.net[0](x))


class Attention(nn.Module):
    """diffusers LTX2Attention: q/k/v projections, RMS norm of q and k across heads, optional rotary
    (separate tables for queries and keys in the audio-video cross attention), optional per-head
    gates (LTX-2.3), output projection. The attention itself is a ragged pass under `label`."""

    def __init__(
        self,
        query_dim: int,
        heads: int,
        head_dim: int,
        kv_dim: int | None = None,
        bias: bool = True,
        out_bias: bool = True,
        eps: float = 1e-6,
        gated: bool = False,
    ):
        super().__init__()
        inner = heads * head_dim
        kv_dim = query_dim if kv_dim is None else kv_dim
        self.heads = heads
        self.norm_q = nn.RMSNorm(inner, eps=eps)
        self.norm_k = nn.RMSNorm(inner, eps=eps)
        self.to_q = nn.Linear(query_dim, inner, bias=bias)
        self.to_k = nn.Linear(kv_dim, inner, bias=bias)
        self.to_v = nn.Linear(kv_dim, inner, bias=bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim, bias=out_bias), nn.Dropout(0.0)])
        self.to_gate_logits = nn.Linear(query_dim, heads, bias=True) if gated else None

    def forward(
        self,
        x: torch.Tensor,
        attention,
        label: str,
        context: torch.Tensor | None = None,
        query_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        value_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [Tq, query_dim]; context [Tkv, kv_dim] (x itself when None) -> [Tq, query_dim].

        value_rows [Tq] bool: tokens whose output is their own value projection instead of the
        attention (spatio-temporal guidance's perturbed self attention; self attention only)."""
        context = x if context is None else context
        query, key, value = self.to_q(x), self.to_k(context), self.to_v(context)
        return self.attend(x, query, key, value, attention, label, query_rope, key_rope, value_rows)

    def context_key_value(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A context's keys (RMS-normed) and values [Tkv, inner], as forward makes them for a cross
        attention without rotary: what attend_context takes."""
        return self.norm_k(self.to_k(context)), self.to_v(context)

    def attend_context(self, x, key, value, attention, label: str) -> torch.Tensor:
        """forward(x, attention, label, context) from context_key_value(context)."""
        return self._attend_normed(x, self.norm_q(self.to_q(x)), key, value, attention, label, None)

    def attend(
        self, x, query, key, value, attention, label, query_rope, key_rope, value_rows
    ) -> torch.Tensor:
        """The rest of forward from the projections (q [Tq, inner], k and v [Tkv, inner])."""
        query, key = self.norm_rotate(query, key, query_rope, key_rope)
        return self._attend_normed(x, query, key, value, attention, label, value_rows)

    def _attend_normed(self, x, query, key, value, attention, label, value_rows) -> torch.Tensor:
        heads = (self.heads, -1)
        out = attention.run(
            label, query.unflatten(-1, heads), key.unflatten(-1, heads), value.unflatten(-1, heads)
        )
        out = out.flatten(-2).to(query.dtype)  # [Tq, inner]
        if value_rows is not None:
            out = torch.where(value_rows[:, None], value, out)
        if self.to_gate_logits is not None:
            # 2 * sigmoid: zero-initialised logits give gates of one
            gates = 2.0 * torch.sigmoid(self.to_gate_logits(x))  # [Tq, heads]
            out = (out.unflatten(-1, heads) * gates.unsqueeze(-1)).flatten(-2)
        return self.to_out[0](out)

    def norm_rotate(self, query, key, query_rope, key_rope) -> tuple[torch.Tensor, torch.Tensor]:
        """q [Tq, inner], k [Tkv, inner] -> each RMS-normed over its row, then rotated (keys with
        key_rope where given, else query_rope; neither without rotary)."""
        query, key = self.norm_q(query), self.norm_k(key)
        if query_rope is not None:
            query = apply_rotary(query, query_rope)
            key = apply_rotary(key, key_rope if key_rope is not None else query_rope)
        return query, key


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift
