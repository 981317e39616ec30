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

from mstar.models.fusion import concat_linears
from mstar.models.rotary import halves_order


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


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The same rotation with each head's pairs stored as halves (evens first, then odds: see
    `halves_order`): contiguous loads instead of stride-2 ones. x [T, H, D]; cos/sin [T, 1, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


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

    `fuse_projections()` (after loading) turns to_q/to_k/to_v into one `to_qkv` GEMM for self
    attention, or to_k/to_v into one `to_kv` GEMM for cross attention; outputs are split by views.
    Cross attention takes its keys and values ready-made (`context_key_value`): they depend only on
    the text, which does not change over a request's steps, so the DiT computes them once per text.
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
        self.fused: str | None = None  # None, "qkv" (self attention) or "kv" (cross attention)
        self.rotary_halves = False  # q/k features in halves order (fused self attention)
        self.qk_kernel = False  # self attention's q/k norm + rotary as mstar::qk_norm_rotary

    def fuse_projections(self, self_attention: bool) -> None:
        """Concatenate the projections that share an input; the separate weights are deleted."""
        if self.fused is not None:
            return
        if self_attention:
            self._reorder_query_key_features()
            self.to_qkv = concat_linears([self.to_q, self.to_k, self.to_v])
            del self.to_q, self.to_k, self.to_v
            self.fused = "qkv"
        else:
            self.to_kv = concat_linears([self.to_k, self.to_v])
            del self.to_k, self.to_v
            self.fused = "kv"

    def _reorder_query_key_features(self) -> None:
        """Queries and keys (projection rows and RMS-norm weights) in halves order, so rotary reads
        contiguous halves. Scores are dot products over each head, the same in any common feature
        order, and values keep theirs: attention's output is unchanged."""
        order = halves_order(self.heads, self.to_q.out_features // self.heads).to(self.to_q.weight.device)
        with torch.no_grad():
            for module in (self.to_q, self.to_k, self.norm_q, self.norm_k):
                module.weight.copy_(module.weight[order])
            for module in (self.to_q, self.to_k):
                if module.bias is not None:
                    module.bias.copy_(module.bias[order])
        self.rotary_halves = True

    def use_qk_kernel(self) -> None:
        """Self attention's q/k RMS norm (over the whole row) and rotary as one Triton kernel
        (mstar.engine.kernels) on CUDA. Needs the halves order, so fuse_projections first."""
        if not self.rotary_halves:
            raise ValueError("the q/k kernel needs fused self-attention projections (halves order)")
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401  registers the op

        self.qk_kernel = True

    def _project_self(self, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [T, dim] of self attention; views into one GEMM output when fused."""
        if self.fused == "qkv":
            return self.to_qkv(x).unflatten(-1, (3, -1)).unbind(-2)  # [T, 3, dim] -> 3 x [T, dim]
        if self.fused == "kv":
            raise ValueError("fused k/v is cross attention's: it takes context_kv, not self attention")
        return self.to_q(x), self.to_k(x), self.to_v(x)

    def context_key_value(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross attention's keys (RMS-normed) and values [Tkv, dim] of a context [Tkv, dim]."""
        if self.fused == "qkv":
            raise ValueError("fused q/k/v is self attention's: it has no separate context keys/values")
        if self.fused == "kv":
            key, value = self.to_kv(context).unflatten(-1, (2, -1)).unbind(-2)  # [Tkv, 2, dim]
        else:
            key, value = self.to_k(context), self.to_v(context)
        return self.norm_k(key), value

    def forward(self, x, attention, label: str, rotary=None, context_kv=None) -> torch.Tensor:
        """x [T, dim] queries. Self attention when context_kv is None, with rotary (cos, sin);
        cross attention over context_kv [2, Tkv, dim]: keys and values from `context_key_value`."""
        heads = (self.heads, -1)
        if context_kv is None and self.qk_kernel and rotary is not None:
            query, key, value = self._project_self(x)
            query, key = self._norm_rotate_kernel(
                query.unflatten(-1, heads), key.unflatten(-1, heads), rotary
            )
        else:
            if context_kv is None:
                query, key, value = self._project_self(x)
                key = self.norm_k(key)
            else:
                query = self.to_q(x)
                key, value = context_kv.unbind(0)
            query = self.norm_q(query).unflatten(-1, heads)  # [T, H, D]
            key = key.unflatten(-1, heads)
            if rotary is not None:
                rotate = apply_rotary_halves if self.rotary_halves else apply_rotary
                query = rotate(query, *rotary)
                key = rotate(key, *rotary)
        out = (
            attention.run(label, query, key, value.unflatten(-1, heads)).flatten(-2).type_as(query)
        )  # [T, dim]
        return self.to_out[0](out)

    def _norm_rotate_kernel(self, query, key, rotary) -> tuple[torch.Tensor, torch.Tensor]:
        """RMS norm over each row (all heads) and rotary, one kernel each for queries and keys [T, H, D]."""
        cos, sin = (table.flatten(1) for table in rotary)  # [T, 1, D/2] -> [T, D/2]
        qk_norm_rotary = torch.ops.mstar.qk_norm_rotary
        return (
            qk_norm_rotary(query, self.norm_q.weight, cos, sin, self.norm_q.eps, "row"),
            qk_norm_rotary(key, self.norm_k.weight, cos, sin, self.norm_k.eps, "row"),
        )


class WanBlock(nn.Module):
    def __init__(self, dim: int, ffn_dim: int, heads: int, cross_attn_norm: bool, eps: float):
        super().__init__()
        self.eps = eps
        self.attn1 = WanAttention(dim, heads, eps)
        self.attn2 = WanAttention(dim, heads, eps)
        self.norm2 = nn.LayerNorm(dim, eps) if cross_attn_norm else None
        self.ffn = FeedForward(dim, ffn_dim)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)
        self.norm_kernel = False  # residual updates + norms as mstar::residual_layer_norm

    def fuse_projections(self) -> None:
        self.attn1.fuse_projections(self_attention=True)
        self.attn2.fuse_projections(self_attention=False)

    def use_norm_kernel(self) -> None:
        """Each residual update and the LayerNorm after it as one Triton kernel on CUDA
        (mstar.engine.kernels.residual_layer_norm); WanDiT then runs the block with
        forward_with_kernel."""
        if self.norm2 is None:
            raise ValueError("the norm kernel needs the cross-attention norm (cross_attn_norm)")
        import mstar.engine.kernels.residual_layer_norm  # noqa: F401  registers the op

        self.norm_kernel = True

    def modulation_tables(self, modulation_rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-item float32 rows [R, dim]: shift, 1 + scale, gate of self attention, then of the FFN."""
        shift, scale, gate, c_shift, c_scale, c_gate = (
            self.scale_shift_table + modulation_rows.float()
        ).unbind(1)
        return shift, 1 + scale, gate, c_shift, 1 + c_scale, c_gate

    def forward_with_kernel(
        self, x, h, tables, next_scale, next_shift, text_kv, row_index, rotary, attention
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward() with `mstar::residual_layer_norm`. x [T, dim] the residual, h [T, dim] this
        block's self-attention input (normed and modulated); tables from modulation_tables. Returns
        (x after the block, the next input: normed and modulated by the next_scale / next_shift
        rows [R, dim], the next block's or the output head's)."""
        _, _, gate, c_shift, c_scale, c_gate = tables
        norm = torch.ops.mstar.residual_layer_norm
        attn_out = self.attn1(h, attention, "self", rotary)
        x, normed = norm(
            x, attn_out, gate, self.norm2.weight, self.norm2.bias, None, None, row_index, self.eps
        )
        cross_out = self.attn2(normed, attention, "cross", context_kv=text_kv)
        x, normed = norm(x, cross_out, None, None, None, c_scale, c_shift, row_index, self.eps)
        return norm(x, self.ffn(normed), c_gate, None, None, next_scale, next_shift, row_index, self.eps)

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
