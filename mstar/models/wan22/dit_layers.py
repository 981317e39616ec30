"""Layers of the Wan DiT over packed tokens. Attribute names follow diffusers' transformer_wan.py so
state-dict keys are identical; every tensor here is packed: [T, ...] with T the tokens of all items.

Modulation is per token without materialising a [T, 6, dim] table: each item contributes one or two
rows (its timestep, and 0 for clean image-conditioning frames) and `row_index` [T] maps a token to
its row; the gather fuses into the elementwise ops under torch.compile.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal_embedding(timesteps: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """diffusers Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0): [R] -> [R, dim] float32."""
    half_dim = dim // 2
    exponent = -math.log(max_period) * torch.arange(half_dim, dtype=torch.float32, device=timesteps.device)
    frequencies = torch.exp(exponent / half_dim)
    angles = timesteps[:, None].float() * frequencies[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def fp32_layer_norm(x: torch.Tensor, eps: float, norm: nn.LayerNorm | None = None) -> torch.Tensor:
    """LayerNorm computed in float32 (diffusers FP32LayerNorm); returns float32."""
    weight = norm.weight.float() if norm is not None else None
    bias = norm.bias.float() if norm is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), weight, bias, eps)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved-pair rotation. x [T, H, D]; cos/sin float32 [T, 1, D/2] (one angle per pair)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


def rotary_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0) -> list[torch.Tensor]:
    """Angles per position for the frame, height and width parts of a head: 3 float64 [max_seq_len, d/2]."""
    h_dim = w_dim = 2 * (head_dim // 6)
    t_dim = head_dim - h_dim - w_dim
    # Explicit CPU: the model may be built under a meta-device context.
    positions = torch.arange(max_seq_len, dtype=torch.float64, device="cpu")
    tables = []
    for dim in (t_dim, h_dim, w_dim):
        exponents = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu")[: dim // 2] / dim
        inv_freq = 1.0 / (theta**exponents)
        tables.append(torch.outer(positions, inv_freq))
    return tables


def grid_rotary(tables: list[torch.Tensor], grid: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin float32 [F*H*W, 1, D/2] for a patch grid (frames, height, width), row-major like the tokens."""
    frames, height, width = grid
    angle_f = tables[0][:frames].view(frames, 1, 1, -1).expand(frames, height, width, -1)
    angle_h = tables[1][:height].view(1, height, 1, -1).expand(frames, height, width, -1)
    angle_w = tables[2][:width].view(1, 1, width, -1).expand(frames, height, width, -1)
    angles = torch.cat([angle_f, angle_h, angle_w], dim=-1).reshape(frames * height * width, 1, -1)
    return angles.cos().float(), angles.sin().float()


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TextProjection(nn.Module):
    """diffusers PixArtAlphaTextProjection with tanh-GELU."""

    def __init__(self, in_features: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_features, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.gelu(self.linear_1(x), approximate="tanh"))


class ConditionEmbedder(nn.Module):
    def __init__(self, dim: int, freq_dim: int, text_dim: int):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_embedder = TimestepEmbedding(freq_dim, dim)
        self.time_proj = nn.Linear(dim, dim * 6)
        self.text_embedder = TextProjection(text_dim, dim)

    def time_rows(self, timesteps: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[R] timesteps -> (temb [R, dim], modulation [R, 6, dim]) in `dtype` (the model's dtype).

        One row at a time: BLAS picks its kernel by row count (gemv for one row), so computing the
        rows together would make a request's output depend on how many items share its step. The
        rows are few and small; the token GEMMs, with hundreds of rows, do not have this problem."""
        embedder_dtype = self.time_embedder.linear_1.weight.dtype
        sinusoid = sinusoidal_embedding(timesteps, self.freq_dim).to(embedder_dtype)  # [R, freq_dim]
        temb = torch.cat([self.time_embedder(row) for row in sinusoid.split(1)]).to(dtype)
        modulation = torch.cat([self.time_proj(F.silu(row)) for row in temb.split(1)])
        return temb, modulation.unflatten(1, (6, -1))


class FeedForward(nn.Module):
    """diffusers FeedForward(activation_fn="gelu-approximate"): keys net.0.proj and net.2."""

    def __init__(self, dim: int, inner_dim: int):
        super().__init__()
        self.net = nn.ModuleList([_GeluProj(dim, inner_dim), nn.Dropout(0.0), nn.Linear(inner_dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.net[0](x))


class _GeluProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class WanAttention(nn.Module):
    """Projections + RMS q/k norm across heads; the attention itself runs on the shared RaggedAttention.

    Cross attention takes its keys and values ready-made (`context_key_value`): they depend only on
    the text, which does not change over a request's steps, so the DiT computes them once per text.
    `project_self` and `norm_rotate` are the seams mstar.models.wan22.optimize's fused modules
    replace (one q/k/v GEMM, rotary on halves, the q/k kernel).
    """

    def __init__(self, dim: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Dropout(0.0)])
        self.norm_q = nn.RMSNorm(dim, eps=eps)
        self.norm_k = nn.RMSNorm(dim, eps=eps)

    def project_self(self, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [T, dim] of self attention."""
        return self.to_q(x), self.to_k(x), self.to_v(x)

    def norm_rotate(self, query, key, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """Self attention's queries and keys [T, dim] -> RMS-normed (over the row) and rotated [T, H, D]."""
        heads = (self.heads, -1)
        key = self.norm_k(key)
        query = self.norm_q(query).unflatten(-1, heads)
        key = key.unflatten(-1, heads)
        return apply_rotary(query, *rotary), apply_rotary(key, *rotary)

    def context_key_value(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross attention's keys (RMS-normed) and values [Tkv, dim] of a context [Tkv, dim]."""
        return self.norm_k(self.to_k(context)), self.to_v(context)

    def forward(self, x, attention, label: str, rotary=None, context_kv=None) -> torch.Tensor:
        """x [T, dim] queries. Self attention when context_kv is None, with rotary (cos, sin);
        cross attention over context_kv [2, Tkv, dim]: keys and values from `context_key_value`."""
        heads = (self.heads, -1)
        if context_kv is None:
            query, key, value = self.project_self(x)
            query, key = self.norm_rotate(query, key, rotary)
        else:
            query = self.norm_q(self.to_q(x)).unflatten(-1, heads)  # [T, H, D]
            key, value = context_kv.unbind(0)
            key = key.unflatten(-1, heads)
        out = (
            attention.run(label, query, key, value.unflatten(-1, heads)).flatten(-2).type_as(query)
        )  # [T, dim]
        return self.to_out[0](out)


class WanBlock(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, heads: int, cross_attn_norm: bool, eps: float):
        super().__init__()
        self.eps = eps
        self.attn1 = WanAttention(dim, heads, eps)
        self.attn2 = WanAttention(dim, heads, eps)
        self.norm2 = nn.LayerNorm(dim, eps) if cross_attn_norm else None
        self.ffn = FeedForward(dim, ffn_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x, text_kv, modulation_rows, row_index, rotary, attention) -> torch.Tensor:
        """x [T, dim]; text_kv [2, Tkv, dim] this layer's cross-attention keys and values (from
        attn2.context_key_value); modulation_rows [R, 6, dim]; row_index [T] int64."""
        # [R, 6, dim] float32 -> six [T, dim] tables, gathered per token
        rows = (self.scale_shift_table + modulation_rows.float()).unbind(1)
        shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate = (r[row_index] for r in rows)
        normed = (fp32_layer_norm(x, self.eps) * (1 + scale_msa) + shift_msa).type_as(x)
        x = (x.float() + self.attn1(normed, attention, "self", rotary) * gate_msa).type_as(x)
        normed = x if self.norm2 is None else fp32_layer_norm(x, self.eps, self.norm2).type_as(x)
        x = x + self.attn2(normed, attention, "cross", context_kv=text_kv)
        normed = (fp32_layer_norm(x, self.eps) * (1 + c_scale) + c_shift).type_as(x)
        return (x.float() + self.ffn(normed).float() * c_gate).type_as(x)


class WanBlocks(nn.ModuleList):
    """The blocks one after another, then the output head's norm: what the head projects.

    A ModuleList, so its parameters keep diffusers' names (blocks.N....). optimize() swaps in a
    subclass that runs the same arithmetic through hand-written kernels."""

    def __init__(self, blocks, eps: float):
        super().__init__(blocks)
        self.eps = eps

    def forward(self, tokens, text_kv, modulation_rows, head_rows, row_index, rotary, attention):
        """tokens [T, dim]; text_kv [num_layers, 2, Tkv, dim]; head_rows (shift, scale) [R, dim] of
        the output head -> its modulated input [T, dim]."""
        for index, block in enumerate(self):
            tokens = block(tokens, text_kv[index], modulation_rows, row_index, rotary, attention)
        shift, scale = head_rows
        return (fp32_layer_norm(tokens, self.eps) * (1 + scale[row_index]) + shift[row_index]).type_as(tokens)
