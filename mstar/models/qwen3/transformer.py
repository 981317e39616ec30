"""Qwen3 (dense) in plain PyTorch over packed tokens: the eager reference serving runs.

Module names follow transformers' Qwen3ForCausalLM, so its checkpoints load key for key
(`model.layers.N.self_attn.q_proj.weight`, ...; `lm_head.weight` tied to the embedding in the
small sizes). A forward takes the tokens of every sequence in a step packed one after another,
[T], with their positions, and an attention object that knows where each token's keys live:

    hidden = model(input_ids, positions, attention)      # [T, hidden]
    logits = model.logits(hidden[last_rows])             # float32 [N, vocab]

`attention.forward(layer, q, k, v)` gets q [T, heads, head_dim] and k, v [T, kv_heads, head_dim]
after the q/k norms and rotary embeddings, and returns [T, heads, head_dim]: serving passes the
KV pool's PagedAttention, training a dense causal attention over [batch, length] rows. Every op
mirrors transformers' (RMSNorm in float32, rotary tables in float32 cast to the activations'
dtype), so both give the same tokens.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.qwen3.config import Qwen3Config


class TokenAttention(Protocol):
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()  # float32 whatever the dtype, as transformers does
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """cos/sin tables [T, head_dim] for positions [T] (neox layout: the two halves rotate)."""

    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        device = positions.device
        exponents = (
            torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        )
        inv_freq = 1.0 / (self.theta**exponents)  # [head_dim / 2] float32, as transformers
        freqs = positions.float()[:, None] * inv_freq[None, :]
        table = torch.cat([freqs, freqs], dim=-1)
        return table.cos().to(dtype), table.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by the tables [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Qwen3Attention(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, dim = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * dim, hidden, bias=False)
        self.q_norm = RMSNorm(dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(dim, config.rms_norm_eps)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> q [T, H, D], k and v [T, Hkv, D] (before norms and rotary)."""
        return (
            self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)),
            self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)),
            self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)),
        )

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: TokenAttention, layer: int
    ) -> torch.Tensor:
        q, k, v = self.project(x)
        q = apply_rotary(self.q_norm(q), cos, sin)
        k = apply_rotary(self.k_norm(k), cos, sin)
        out = attention.forward(layer, q, k, v).to(x.dtype)  # [T, H, D]
        return self.o_proj(out.flatten(-2))


class Qwen3MLP(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Qwen3Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x, cos, sin, attention: TokenAttention, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = Rotary(config.head_dim, config.rope_theta)


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # the checkpoint loader fills tied tensors from their source ({target: source})
        self._tied_weights_keys = (
            {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}
        )
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: TokenAttention
    ) -> torch.Tensor:
        """input_ids, positions [T] (int64) -> final hidden states [T, hidden] (after the norm)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary(positions, x.dtype)
        for index, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attention, index)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()


class DenseCausalAttention:
    """Attention over [batch, length] rows packed as T = batch * length tokens (training, tests):
    causal SDPA per row, no pool."""

    def __init__(self, batch: int, length: int, scale: float):
        self.batch, self.length, self.scale = batch, length, scale

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        def rows(x: torch.Tensor) -> torch.Tensor:  # [B * L, H, D] -> [B, H, L, D]
            return x.unflatten(0, (self.batch, self.length)).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            rows(q), rows(k), rows(v), is_causal=True, scale=self.scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        return out.transpose(1, 2).flatten(0, 1)
