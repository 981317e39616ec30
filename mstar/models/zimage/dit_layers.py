"""Z-Image DiT building blocks, parameter names identical to diffusers' ZImageTransformer2DModel.

All token tensors are packed: [T, dim] with T the tokens of every segment one after another.
Per-token modulation comes in already gathered to tokens ([T, k*dim]).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

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
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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


class SelfAttention(nn.Module):
    """Keys as diffusers' Attention(qk_norm="rms_norm", bias=False, out_bias=False). `project` and
    `norm_rotate` are the seams mstar.models.zimage.optimize's fused modules replace."""

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

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v each [T, H, D]."""
        heads = (self.n_heads, -1)
        return (
            self.to_q(x).unflatten(-1, heads),
            self.to_k(x).unflatten(-1, heads),
            self.to_v(x).unflatten(-1, heads),
        )

    def norm_rotate(self, q, k, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and keys [T, H, D]: RMS-normed per head (qk_norm) and rotated."""
        if self.norm_q is not None:
            q = self.norm_q(q)
        if self.norm_k is not None:
            k = self.norm_k(k)
        cos, sin = rope
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attn, label: str
    ) -> torch.Tensor:
        q, k, v = self.project(x)  # [T, H, D] each
        q, k = self.norm_rotate(q, k, rope)
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


class ModulatedBlocks(nn.ModuleList):
    """Modulated blocks one after another (the noise refiner, the main layers). A ModuleList, so the
    parameters keep diffusers' names; optimize() swaps in a subclass that runs them through kernels."""

    def forward(self, x, rope, attn, label: str, item_emb, token_item) -> torch.Tensor:
        for block in self:
            x = block(x, rope, attn, label, item_emb, token_item)
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
