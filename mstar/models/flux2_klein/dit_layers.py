"""The FLUX.2 transformer's layers over packed tokens, with diffusers' state-dict keys
(Flux2Transformer2DModel): timestep embedding, the global modulations, double-stream blocks
(separate text and image weights, joint attention) and single-stream blocks (one fused
projection for attention and MLP). Each block takes its modulation already gathered per token,
so one forward serves many items with their own timesteps."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MAX_PERIOD = 10000.0


def timestep_sinusoid(timesteps: torch.Tensor, num_channels: int) -> torch.Tensor:
    """timesteps [N] -> [N, num_channels] fp32, cos half then sin half, computed as diffusers'
    get_timestep_embedding(flip_sin_to_cos=True, downscale_freq_shift=0)."""
    half = num_channels // 2
    exponent = -math.log(MAX_PERIOD) * torch.arange(half, dtype=torch.float32, device=timesteps.device)
    frequencies = torch.exp(exponent / half)
    angles = timesteps[:, None].float() * frequencies[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class MLPEmbedder(nn.Module):
    """diffusers' TimestepEmbedding without biases: linear_1, SiLU, linear_2."""

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim, bias=False)
        self.linear_2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TimeGuidanceEmbed(nn.Module):
    """Keys `time_guidance_embed.*`. The guidance embedder exists only in checkpoints with
    guidance_embeds; the klein pipeline never passes guidance, so it is loaded and not run."""

    def __init__(self, in_channels: int, dim: int, guidance_embeds: bool):
        super().__init__()
        self.in_channels = in_channels
        self.timestep_embedder = MLPEmbedder(in_channels, dim)
        self.guidance_embedder = MLPEmbedder(in_channels, dim) if guidance_embeds else None

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        """timesteps [N] in the model dtype, 0..1000 scale -> [N, dim]."""
        projected = timestep_sinusoid(timesteps, self.in_channels).to(timesteps.dtype)
        return self.timestep_embedder(projected)


class Modulation(nn.Module):
    """One global modulation shared by every block of a kind: silu then a bias-free linear to
    3 x `num_sets` rows (shift, scale, gate per set)."""

    def __init__(self, dim: int, num_sets: int):
        super().__init__()
        self.num_sets = num_sets
        self.linear = nn.Linear(dim, dim * 3 * num_sets, bias=False)

    def forward(self, temb: torch.Tensor) -> torch.Tensor:
        """temb [N, dim] -> [N, 3 * num_sets * dim]: (shift, scale, gate, shift, ...) side by side,
        kept whole so a pack gathers them per token in one index (chunk after)."""
        return self.linear(F.silu(temb))


def per_token(rows: torch.Tensor, token_item: torch.Tensor | None) -> torch.Tensor:
    """Per-item rows [N, dim] -> per-token rows [T, dim]; a single item stays [1, dim] (broadcast)."""
    return rows if token_item is None else rows[token_item]


def modulated_norm(
    x: torch.Tensor, norm: nn.LayerNorm, shift: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    return (1 + scale) * norm(x) + shift


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated as interleaved (even, odd) pairs; cos/sin [T, D/2] fp32. The same fp32
    arithmetic as diffusers' apply_rotary_emb (x * cos + rotate(x) * sin), cast back."""
    pairs = x.float().unflatten(-1, (-1, 2))  # [T, H, D/2, 2]
    real, imag = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    rotated = torch.stack([real * cos - imag * sin, imag * cos + real * sin], dim=-1)
    return rotated.flatten(-2).to(x.dtype)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


class FeedForward(nn.Module):
    """Flux2FeedForward: linear_in to 2 x hidden, SwiGLU, linear_out."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden_dim, bias=False)
        self.linear_out = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_out(swiglu(self.linear_in(x)))


class JointAttention(nn.Module):
    """Flux2Attention with added (text) projections: keys `attn.to_q/.../to_out.0`,
    `attn.add_q_proj/.../to_add_out`, q/k RMS norms per stream."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, eps: float):
        super().__init__()
        inner = num_heads * head_dim
        self.head_dim = head_dim
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.norm_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=eps)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim, bias=False)])
        self.add_q_proj, self.add_k_proj, self.add_v_proj = (
            nn.Linear(dim, inner, bias=False) for _ in range(3)
        )
        self.norm_added_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_added_k = nn.RMSNorm(head_dim, eps=eps)
        self.to_add_out = nn.Linear(inner, dim, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (-1, self.head_dim))  # [T, H, D]

    def forward(
        self, txt: torch.Tensor, img: torch.Tensor, packed, attn
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """txt [Tt, dim], img [Ti, dim] (normed, modulated) -> their attention outputs."""
        heads = self._heads
        query = packed.joint(
            self.norm_added_q(heads(self.add_q_proj(txt))), self.norm_q(heads(self.to_q(img)))
        )
        key = packed.joint(self.norm_added_k(heads(self.add_k_proj(txt))), self.norm_k(heads(self.to_k(img))))
        value = packed.joint(heads(self.add_v_proj(txt)), heads(self.to_v(img)))
        query = apply_rotary(query, packed.cos, packed.sin)
        key = apply_rotary(key, packed.cos, packed.sin)
        out = attn.run(packed.label, query, key, value).flatten(1).to(query.dtype)  # [T, H * D]
        txt_out, img_out = packed.streams(out, txt.shape[0])
        return self.to_add_out(txt_out), self.to_out[0](img_out)


class DoubleStreamBlock(nn.Module):
    """Flux2TransformerBlock: text and image streams with their own norms, FFNs and projections,
    one joint attention. `img_mod`/`txt_mod` are the six per-token rows of each stream."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, mlp_hidden_dim: int, eps: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.norm1_context = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.attn = JointAttention(dim, num_heads, head_dim, eps)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.ff = FeedForward(dim, mlp_hidden_dim)
        self.norm2_context = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.ff_context = FeedForward(dim, mlp_hidden_dim)

    def forward(self, txt, img, txt_mod, img_mod, packed, attn) -> tuple[torch.Tensor, torch.Tensor]:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = img_mod
        c_shift_msa, c_scale_msa, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = txt_mod
        txt_attn, img_attn = self.attn(
            modulated_norm(txt, self.norm1_context, c_shift_msa, c_scale_msa),
            modulated_norm(img, self.norm1, shift_msa, scale_msa),
            packed,
            attn,
        )
        img = img + gate_msa * img_attn
        img = img + gate_mlp * self.ff(modulated_norm(img, self.norm2, shift_mlp, scale_mlp))
        txt = txt + c_gate_msa * txt_attn
        txt = txt + c_gate_mlp * self.ff_context(
            modulated_norm(txt, self.norm2_context, c_shift_mlp, c_scale_mlp)
        )
        return txt, img


class ParallelSelfAttention(nn.Module):
    """Flux2ParallelSelfAttention: one projection to q, k, v and the MLP's two halves, one
    projection back from [attention, MLP]. Keys `attn.to_qkv_mlp_proj`, `attn.norm_q/k`, `attn.to_out`."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, mlp_hidden_dim: int, eps: float):
        super().__init__()
        self.head_dim = head_dim
        self.inner_dim = num_heads * head_dim
        self.mlp_hidden_dim = mlp_hidden_dim
        self.to_qkv_mlp_proj = nn.Linear(dim, 3 * self.inner_dim + 2 * mlp_hidden_dim, bias=False)
        self.norm_q = nn.RMSNorm(head_dim, eps=eps)
        self.norm_k = nn.RMSNorm(head_dim, eps=eps)
        self.to_out = nn.Linear(self.inner_dim + mlp_hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, packed, attn) -> torch.Tensor:
        qkv, mlp = self.to_qkv_mlp_proj(x).split([3 * self.inner_dim, 2 * self.mlp_hidden_dim], dim=-1)
        query, key, value = (part.unflatten(-1, (-1, self.head_dim)) for part in qkv.chunk(3, dim=-1))
        query = apply_rotary(self.norm_q(query), packed.cos, packed.sin)
        key = apply_rotary(self.norm_k(key), packed.cos, packed.sin)
        out = attn.run(packed.label, query, key, value).flatten(1).to(query.dtype)
        return self.to_out(torch.cat([out, swiglu(mlp)], dim=-1))


class SingleStreamBlock(nn.Module):
    """Flux2SingleTransformerBlock over the joint tokens; `mod` is (shift, scale, gate) per token."""

    def __init__(self, dim: int, num_heads: int, head_dim: int, mlp_hidden_dim: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.attn = ParallelSelfAttention(dim, num_heads, head_dim, mlp_hidden_dim, eps)

    def forward(self, x: torch.Tensor, mod, packed, attn) -> torch.Tensor:
        shift, scale, gate = mod
        return x + gate * self.attn(modulated_norm(x, self.norm, shift, scale), packed, attn)


class DoubleStreamBlocks(nn.ModuleList):
    """The double-stream blocks in order (keys `transformer_blocks.N.*`). Every block takes the same
    modulation rows per stream (one global modulation each): `rows` holds them per item (ItemRows),
    gathered per token here once for all blocks."""

    def forward(self, txt, img, rows, packed, attn) -> tuple[torch.Tensor, torch.Tensor]:
        img_mod = per_token(rows.image, packed.maps.image_item).chunk(6, dim=-1)  # 6 x [Ti, dim]
        txt_mod = per_token(rows.text, packed.maps.text_item).chunk(6, dim=-1)  # 6 x [Tt, dim]
        for block in self:
            txt, img = block(txt, img, txt_mod, img_mod, packed, attn)
        return txt, img


class SingleStreamBlocks(nn.ModuleList):
    """The single-stream blocks in order (keys `single_transformer_blocks.N.*`) over the joint
    tokens, all with the same (shift, scale, gate) rows per item (ItemRows.single)."""

    def forward(self, joint: torch.Tensor, rows, packed, attn) -> torch.Tensor:
        mod = per_token(rows.single, packed.maps.joint_item).chunk(3, dim=-1)  # 3 x [T, dim]
        for block in self:
            joint = block(joint, mod, packed, attn)
        return joint


class OutputNorm(nn.Module):
    """AdaLayerNormContinuous(elementwise_affine=False, bias=False): keys `norm_out.linear`; its
    rows are (scale, shift), in that order."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.linear = nn.Linear(dim, 2 * dim, bias=False)

    def rows(self, temb: torch.Tensor) -> torch.Tensor:
        """temb [N, dim] -> [N, 2 * dim]: the (scale, shift) rows side by side."""
        return self.linear(F.silu(temb).to(self.linear.weight.dtype))

    def forward(self, x: torch.Tensor, rows: torch.Tensor, token_item: torch.Tensor | None) -> torch.Tensor:
        scale, shift = per_token(rows, token_item).chunk(2, dim=-1)
        return self.norm(x) * (1 + scale) + shift
