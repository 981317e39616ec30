"""One Cosmos3 decoder layer: two pathways with their own weights, joined by attention.

Attribute names follow diffusers' transformer_cosmos3.py, so state-dict keys are identical:
the understanding pathway (text) uses to_q/to_k/to_v/to_out, mlp and the plain norms; the
generation pathway (vision) uses add_q_proj/add_k_proj/add_v_proj/to_add_out, mlp_moe_gen and the
*_moe_gen norms. The two never run together here:

    hidden, k, v = layer.understand(text_hidden, cos, sin, attention)   # once per prompt
    vision_hidden = layer.generate(vision_hidden, cos, sin, dense, index)  # every step

`understand` returns the keys and values the generation pathway attends to (keys normed for
generation and rotated at the text positions); `generate`'s queries attend to them plus the vision
tokens' own keys through the dense prefix attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.cosmos3.config import Cosmos3TransformerConfig
from mstar.models.cosmos3.rope import rotate

UNDERSTANDING_LABEL = "understanding"
GENERATION_LABEL = "generation"


class RMSNorm(nn.Module):
    """diffusers' RMSNorm: variance in float32; a half-precision weight multiplies in its dtype."""

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


class NemotronRMSNorm(RMSNorm):
    """The Nemotron (ReLU^2 backbone) norm: everything in float32, cast back at the end."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x).to(input_dtype)


def make_norm(config: Cosmos3TransformerConfig, dim: int) -> RMSNorm:
    return (NemotronRMSNorm if config.nemotron else RMSNorm)(dim, config.rms_norm_eps)


class MLP(nn.Module):
    """silu: down(silu(gate(x)) * up(x)); relu2: down(relu(up(x))^2) (no gate_proj)."""

    def __init__(self, config: Cosmos3TransformerConfig):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gated = config.hidden_act == "silu"
        if self.gated:
            self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(torch.relu(self.up_proj(x)).square())


class PackedMoTAttention(nn.Module):
    """Both pathways' projections and per-head norms (diffusers' Cosmos3PackedMoTAttention keys)."""

    def __init__(self, config: Cosmos3TransformerConfig):
        super().__init__()
        hidden, bias = config.hidden_size, config.attention_bias
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = head_dim = config.head_dim
        q_dim, kv_dim = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.to_q = nn.Linear(hidden, q_dim, bias=bias)
        self.to_k = nn.Linear(hidden, kv_dim, bias=bias)
        self.to_v = nn.Linear(hidden, kv_dim, bias=bias)
        self.to_out = nn.Linear(q_dim, hidden, bias=bias)
        self.norm_q = make_norm(config, head_dim) if config.qk_norm_for_text else None
        self.norm_k = make_norm(config, head_dim) if config.qk_norm_for_text else None
        self.k_norm_und_for_gen = make_norm(config, head_dim) if config.has_und_k_norm_for_gen else None
        self.add_q_proj = nn.Linear(hidden, q_dim, bias=bias)
        self.add_k_proj = nn.Linear(hidden, kv_dim, bias=bias)
        self.add_v_proj = nn.Linear(hidden, kv_dim, bias=bias)
        self.to_add_out = nn.Linear(q_dim, hidden, bias=bias)
        self.norm_added_q = make_norm(config, head_dim)
        self.norm_added_k = make_norm(config, head_dim)

    def understanding_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, with_queries: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Text hidden [L, hidden] -> (q [L, H, D] or None, k and k_for_gen [L, Hkv, D], v)."""
        k = self.to_k(x).view(-1, self.num_kv_heads, self.head_dim)
        v = self.to_v(x).view(-1, self.num_kv_heads, self.head_dim)
        if self.norm_k is not None:
            k = self.norm_k(k)
        k_for_gen = self.k_norm_und_for_gen(k) if self.k_norm_und_for_gen is not None else k
        q = None
        if with_queries:
            q = self.to_q(x).view(-1, self.num_heads, self.head_dim)
            if self.norm_q is not None:
                q = self.norm_q(q)
            q = rotate(q, cos, sin)
        return q, rotate(k, cos, sin), rotate(k_for_gen, cos, sin), v

    def generation_qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Vision hidden [T, hidden] -> q [T, H, D], k [T, Hkv, D], v [T, Hkv, D], rotated."""
        q = self.norm_added_q(self.add_q_proj(x).view(-1, self.num_heads, self.head_dim))
        k = self.norm_added_k(self.add_k_proj(x).view(-1, self.num_kv_heads, self.head_dim))
        v = self.add_v_proj(x).view(-1, self.num_kv_heads, self.head_dim)
        return rotate(q, cos, sin), rotate(k, cos, sin), v


class Cosmos3Layer(nn.Module):
    """diffusers' Cosmos3VLTextMoTDecoderLayer, one pathway at a time."""

    def __init__(self, config: Cosmos3TransformerConfig):
        super().__init__()
        self.self_attn = PackedMoTAttention(config)
        self.mlp = MLP(config)
        self.mlp_moe_gen = MLP(config)
        self.input_layernorm = make_norm(config, config.hidden_size)
        self.input_layernorm_moe_gen = make_norm(config, config.hidden_size)
        self.post_attention_layernorm = make_norm(config, config.hidden_size)
        self.post_attention_layernorm_moe_gen = make_norm(config, config.hidden_size)

    def understand(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention, last: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """One prompt's text hidden [L, hidden] -> (next hidden, k_for_gen [L, Hkv, D], v);
        `attention` (a RaggedAttention) has UNDERSTANDING_LABEL planned causal over the L tokens.

        The last layer's text output feeds nothing the generation pathway reads: it stops after
        its keys and values (next hidden None)."""
        attn = self.self_attn
        q, k, k_for_gen, v = attn.understanding_qkv(self.input_layernorm(hidden), cos, sin, not last)
        if last:
            return None, k_for_gen, v
        out = attention.run(UNDERSTANDING_LABEL, q, k, v)  # [L, H, D]
        hidden = hidden + attn.to_out(out.flatten(1).to(hidden.dtype))
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, k_for_gen, v

    def generate(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention, index: int
    ) -> torch.Tensor:
        """Packed vision hidden [T, hidden] -> next hidden; `attention` (a planned PrefixAttention)
        adds each segment's prefix keys/values of layer `index`."""
        attn = self.self_attn
        q, k, v = attn.generation_qkv(self.input_layernorm_moe_gen(hidden), cos, sin)
        out = attention.run(GENERATION_LABEL, index, q, k, v)  # [T, H, D]
        hidden = hidden + attn.to_add_out(out.flatten(1).to(hidden.dtype))
        return hidden + self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(hidden))
