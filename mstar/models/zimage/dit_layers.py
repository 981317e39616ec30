"""Z-Image DiT building blocks, parameter names identical to diffusers' ZImageTransformer2DModel.

All token tensors are packed: [T, dim] with T the tokens of every segment one after another.
Per-token modulation comes in already gathered to tokens ([T, k*dim]).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.fusion import concat_linears
from mstar.models.rotary import halves_order

ADALN_EMBED_DIM = 256
FREQUENCY_EMBEDDING_SIZE = 256
TIMESTEP_MID_SIZE = 1024


class RMSNorm(nn.Module):
    """As diffusers' RMSNorm: statistics in fp32, cast to the weight dtype before the scale."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return x * self.weight


class TimestepEmbedder(nn.Module):
    def __init__(self, out_size: int, mid_size: int = TIMESTEP_MID_SIZE):
        super().__init__()
        self.mlp = nn.Sequential(
            nn.Linear(FREQUENCY_EMBEDDING_SIZE, mid_size, bias=True),
            nn.SiLU(),
            nn.Linear(mid_size, out_size, bias=True),
        )

    @staticmethod
    def sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
        """t [B] fp32 -> [B, dim] as cos then sin halves."""
        half = dim // 2
        exponent = torch.arange(half, dtype=torch.float32, device=t.device) / half
        freqs = torch.exp(-math.log(max_period) * exponent)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        t_freq = self.sinusoid(t, FREQUENCY_EMBEDDING_SIZE).to(self.mlp[0].weight.dtype)
        return self.mlp(t_freq)


class FeedForward(nn.Module):
    """SwiGLU; `fuse_projections()` makes the gate (w1) and up (w3) projections one `w13` GEMM."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.fused = False

    def fuse_projections(self) -> None:
        if not self.fused:
            self.w13 = concat_linears([self.w1, self.w3])
            del self.w1, self.w3
            self.fused = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gate, up = self.w13(x).unflatten(-1, (2, -1)).unbind(-2)  # [T, 2, hidden] -> 2 x [T, hidden]
            return self.w2(F.silu(gate) * up)
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def per_token(values: torch.Tensor, token_item: torch.Tensor) -> torch.Tensor:
    """Per-item rows [num_items, n] -> per-token rows [T, n]; one item broadcasts as [1, n]."""
    return values if values.shape[0] == 1 else values[token_item]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] with (even, odd) channel pairs as complex numbers; cos/sin [T, D/2] fp32.
    Same arithmetic as diffusers' complex multiply, done in fp32 then cast back."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [T, H, D/2, 2]
    real, imag = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return rotated.flatten(-2).type_as(x)


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` with each head's pairs stored as halves (see `halves_order`): the same fp32
    arithmetic per element, from two contiguous halves instead of stride-2 pairs."""
    real, imag = x.float().chunk(2, dim=-1)  # [T, H, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([real * cos - imag * sin, real * sin + imag * cos], dim=-1).type_as(x)


class SelfAttention(nn.Module):
    """Keys as diffusers' Attention(qk_norm="rms_norm", bias=False, out_bias=False)."""

    def __init__(self, dim: int, n_heads: int, qk_norm: bool):
        super().__init__()
        self.n_heads = n_heads
        head_dim = dim // n_heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim, bias=False)])
        self.norm_q = RMSNorm(head_dim, eps=1e-5) if qk_norm else None
        self.norm_k = RMSNorm(head_dim, eps=1e-5) if qk_norm else None
        self.fused = False
        self.rotary_halves = False  # q/k features in halves order (set by fuse_projections)
        self.qk_kernel = False  # q/k norm + rotary as mstar::qk_norm_rotary (use_qk_kernel)

    def fuse_projections(self) -> None:
        """to_q/to_k/to_v as one `to_qkv` GEMM (after loading); the separate weights are deleted.
        Queries and keys move to halves order first, so rotary reads contiguous halves."""
        if not self.fused:
            self._reorder_query_key_features()
            self.to_qkv = concat_linears([self.to_q, self.to_k, self.to_v])
            del self.to_q, self.to_k, self.to_v
            self.fused = True

    def _reorder_query_key_features(self) -> None:
        """Projection rows in halves order per head; the q/k RMS norms (over one head) take their
        weights in the same order. Scores, and so the output, are unchanged (mstar.models.rotary)."""
        head_dim = self.to_q.out_features // self.n_heads
        order = halves_order(self.n_heads, head_dim).to(self.to_q.weight.device)
        with torch.no_grad():
            for linear in (self.to_q, self.to_k):
                linear.weight.copy_(linear.weight[order])
            for norm in (self.norm_q, self.norm_k):
                if norm is not None:
                    norm.weight.copy_(norm.weight[order[:head_dim]])
        self.rotary_halves = True

    def use_qk_kernel(self) -> None:
        """Queries' and keys' RMS norm and rotary as one Triton kernel (mstar.engine.kernels) on
        CUDA. Needs the halves order, so fuse_projections first."""
        if not self.rotary_halves or self.norm_q is None or self.norm_k is None:
            raise ValueError("the q/k kernel needs fused projections (halves order) and q/k norms")
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401  registers the op

        self.qk_kernel = True

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v each [T, H, D]; views into one GEMM output when fused."""
        if self.fused:
            return self.to_qkv(x).unflatten(-1, (3, self.n_heads, -1)).unbind(-3)  # [T, 3, H, D]
        heads = (self.n_heads, -1)
        return (
            self.to_q(x).unflatten(-1, heads),
            self.to_k(x).unflatten(-1, heads),
            self.to_v(x).unflatten(-1, heads),
        )

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attn, label: str
    ) -> torch.Tensor:
        q, k, v = self._project(x)  # [T, H, D] each
        if self.qk_kernel:
            cos, sin = rope  # [T, D/2] fp32
            q = torch.ops.mstar.qk_norm_rotary(q, self.norm_q.weight, cos, sin, self.norm_q.eps, "head")
            k = torch.ops.mstar.qk_norm_rotary(k, self.norm_k.weight, cos, sin, self.norm_k.eps, "head")
            return self._attend(q, k, v, attn, label)
        if self.norm_q is not None:
            q = self.norm_q(q)
        if self.norm_k is not None:
            k = self.norm_k(k)
        cos, sin = rope
        rotate = apply_rotary_halves if self.rotary_halves else apply_rotary
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        return self._attend(q, k, v, attn, label)

    def _attend(self, q, k, v, attn, label: str) -> torch.Tensor:
        out = attn.run(label, q, k, v.to(q.dtype))  # [T, H, D]
        return self.to_out[0](out.flatten(1).to(q.dtype))


class TransformerBlock(nn.Module):
    """One Z-Image block. With modulation (noise refiner, main layers) `mod_input` is the timestep
    embedding gathered per token [T, adaln_dim]; without (context refiner) it is None."""

    def __init__(self, dim: int, n_heads: int, norm_eps: float, qk_norm: bool, modulation: bool = True):
        super().__init__()
        self.attention = SelfAttention(dim, n_heads, qk_norm)
        self.feed_forward = FeedForward(dim, int(dim / 3 * 8))
        self.attention_norm1 = RMSNorm(dim, eps=norm_eps)
        self.ffn_norm1 = RMSNorm(dim, eps=norm_eps)
        self.attention_norm2 = RMSNorm(dim, eps=norm_eps)
        self.ffn_norm2 = RMSNorm(dim, eps=norm_eps)
        self.modulation = modulation
        if modulation:
            self.adaLN_modulation = nn.Sequential(nn.Linear(min(dim, ADALN_EMBED_DIM), 4 * dim, bias=True))
        self.norm_kernel = False  # residual updates + norms as mstar::gated_residual_rms_norm

    def fuse_projections(self) -> None:
        self.attention.fuse_projections()
        self.feed_forward.fuse_projections()

    def use_norm_kernel(self) -> None:
        """Each residual update and the norm after it as one Triton kernel on CUDA
        (mstar.engine.kernels.gated_residual_norm); `run_modulated_blocks` then runs the block."""
        norms = (self.attention_norm1, self.attention_norm2, self.ffn_norm1, self.ffn_norm2)
        if not self.modulation or len({norm.eps for norm in norms}) != 1:
            raise ValueError("the norm kernel needs a modulated block whose norms share one eps")
        import mstar.engine.kernels.gated_residual_norm  # noqa: F401  registers the op

        self.norm_kernel = True

    def modulation_rows(self, item_emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per-item rows [num_items, dim]: 1 + scale_msa, tanh(gate_msa), 1 + scale_mlp, tanh(gate_mlp)."""
        scale_msa, gate_msa, scale_mlp, gate_mlp = self.adaLN_modulation(item_emb).chunk(4, dim=1)
        return 1.0 + scale_msa, gate_msa.tanh(), 1.0 + scale_mlp, gate_mlp.tanh()

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        attn,
        label: str,
        item_emb: torch.Tensor | None = None,
        token_item: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [T, dim]; item_emb [num_items, adaln_dim]; token_item [T] (item index of each token)."""
        if not self.modulation:
            x = x + self.attention_norm2(self.attention(self.attention_norm1(x), rope, attn, label))
            return x + self.ffn_norm2(self.feed_forward(self.ffn_norm1(x)))
        rows = self.modulation_rows(item_emb)
        scale_msa, gate_msa, scale_mlp, gate_mlp = (per_token(row, token_item) for row in rows)
        attn_out = self.attention(self.attention_norm1(x) * scale_msa, rope, attn, label)
        x = x + gate_msa * self.attention_norm2(attn_out)
        return x + gate_mlp * self.ffn_norm2(self.feed_forward(self.ffn_norm1(x) * scale_mlp))

    def forward_with_kernel(
        self, x, h, rows, rope, attn, label: str, token_item, next_norm=None, next_scale=None
    ):
        """The modulated forward with `mstar::gated_residual_rms_norm`. x [T, dim] the residual, h
        [T, dim] this block's attention input (normed and scaled). Returns (x after the block, the
        next block's attention input: normed by next_norm and scaled by next_scale rows; empty
        [0, dim] for the last block)."""
        _, gate_msa, scale_mlp, gate_mlp = rows  # [num_items, dim] each
        gated_norm = torch.ops.mstar.gated_residual_rms_norm
        eps = self.ffn_norm1.eps
        attn_out = self.attention(h, rope, attn, label)
        x, h = gated_norm(
            x,
            attn_out,
            gate_msa,
            self.attention_norm2.weight,
            self.ffn_norm1.weight,
            scale_mlp,
            token_item,
            eps,
        )
        next_weight = None if next_norm is None else next_norm.weight
        return gated_norm(
            x, self.feed_forward(h), gate_mlp, self.ffn_norm2.weight, next_weight, next_scale, token_item, eps
        )


def run_modulated_blocks(blocks, x, rope, attn, label: str, item_emb, token_item) -> torch.Tensor:
    """Modulated blocks one after another over x [T, dim]. With the norm kernel each block hands the
    next its attention input, normed and scaled in the same kernel as its last residual update."""
    if not blocks[0].norm_kernel:
        for block in blocks:
            x = block(x, rope, attn, label, item_emb, token_item)
        return x
    if token_item is None:
        token_item = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    rows = [block.modulation_rows(item_emb) for block in blocks]
    h = blocks[0].attention_norm1(x) * per_token(rows[0][0], token_item)
    for index, block in enumerate(blocks):
        is_last = index + 1 == len(blocks)
        next_norm = None if is_last else blocks[index + 1].attention_norm1
        next_scale = None if is_last else rows[index + 1][0]
        x, h = block.forward_with_kernel(
            x, h, rows[index], rope, attn, label, token_item, next_norm, next_scale
        )
    return x


class FinalLayer(nn.Module):
    def __init__(self, dim: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(min(dim, ADALN_EMBED_DIM), dim, bias=True))

    def forward(self, x: torch.Tensor, item_emb: torch.Tensor, token_item: torch.Tensor) -> torch.Tensor:
        scale = per_token(1.0 + self.adaLN_modulation(item_emb), token_item)  # [T, dim] or [1, dim]
        return self.linear(self.norm_final(x) * scale)


class RopeTables:
    """Per-axis cos/sin tables [axis_len, axis_dim/2] (fp32), built as diffusers' RopeEmbedder does
    (float64 angles rounded to fp32), gathered by 3-axis position ids."""

    def __init__(self, theta: float, axes_dims: tuple[int, ...], axes_lens: tuple[int, ...]):
        self.tables: list[tuple[torch.Tensor, torch.Tensor]] = []
        for axis_dim, axis_len in zip(axes_dims, axes_lens, strict=True):
            # Explicitly on the CPU: the model may be constructed under a meta or CUDA device context.
            exponents = torch.arange(0, axis_dim, 2, dtype=torch.float64, device="cpu") / axis_dim
            inv_freq = 1.0 / (theta**exponents)
            positions = torch.arange(axis_len, dtype=torch.float64, device="cpu")
            angles = torch.outer(positions, inv_freq).float()
            self.tables.append((torch.cos(angles), torch.sin(angles)))
        self._device_tables: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def _on(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if device not in self._device_tables:
            self._device_tables[device] = [(c.to(device), s.to(device)) for c, s in self.tables]
        return self._device_tables[device]

    def __call__(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [T, 3] int -> (cos, sin) each [T, head_dim/2] fp32."""
        tables = self._on(position_ids.device)
        cos = torch.cat([c[position_ids[:, i]] for i, (c, _) in enumerate(tables)], dim=-1)
        sin = torch.cat([s[position_ids[:, i]] for i, (_, s) in enumerate(tables)], dim=-1)
        return cos, sin
