"""Speed-ups of Qwen3 as one transform over the loaded eager model: `optimize(model)`, then
`compile_fused(fused, mode)`.

    model = load_qwen3(config, device, dtype, folder)     # transformers' keys, the eager reference
    fused = optimize(model)                               # q/k/v and gate/up as one GEMM each
    compiled = compile_fused(fused, "deterministic")      # everything but attention compiled

The eager model runs ~60 small kernels a layer (float32 RMSNorms of ~8 elementwise kernels each,
rotary through cat/neg/mul/add, separate projections, casts); replayed in a CUDA graph each still
costs ~2 us of device time, and an eager prefill of a few tokens is bound by their launches. The
fused model computes a layer in two parts around its attention call, each part compiled:

    before attention   input RMSNorm -> q/k/v GEMM -> q/k RMSNorms -> rotary
    attention          attention.forward: the pool write and paged attention (eager, as is)
    after attention    o_proj -> residual -> RMSNorm -> gate/up GEMM -> silu * up -> down -> residual

and runs each layer's "after" with the next layer's "before" as one compiled call
(`between_layers`: the residual update and the next input norm become one kernel, and a step makes
one compiled call a layer); the step's first call also embeds the tokens and makes the rotary
tables, its last applies the final norm. These are free functions taking the layers' weights as
tensor arguments, so one compile serves every layer (the weights have the same shapes in each;
dynamo keeps parameters' shapes static) and every token count: dynamo's automatic dynamic compiles
the shapes it first sees and makes the token count dynamic when it changes, so each function
holds two graphs, one token (size 1 is always specialised) and any other count. The arithmetic is
the eager model's, op for op (float32 norm statistics, rotary tables in the activations' dtype);
only the GEMMs' weights are concatenated.

The transform consumes the eager model: each layer's separate projections are dropped as its fused
ones are made, so memory stays flat. It runs after the checkpoint is loaded under transformers'
keys; the fused modules' own names (`qkv_proj`, `gate_up_proj`) are never loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.fusion import concat_linears
from mstar.models.qwen3.transformer import Qwen3DecoderLayer, Qwen3ForCausalLM, TokenAttention


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference RMSNorm: float32 statistics, the weight applied in the input's dtype."""
    normed = x.float()
    normed = normed * torch.rsqrt(normed.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by the tables [T, D] (neox halves), as the reference's apply_rotary."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def step_inputs(
    input_ids: torch.Tensor, positions: torch.Tensor, embed_weight: torch.Tensor, inv_freq: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, positions [T] -> the embeddings [T, hidden] and the rotary cos, sin [T, head_dim]."""
    x = F.embedding(input_ids, embed_weight)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2] float32
    table = torch.cat([freqs, freqs], dim=-1)
    return x, table.cos().to(x.dtype), table.sin().to(x.dtype)


def attention_inputs(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    qkv_weight: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, hidden] -> q [T, H, D], k and v [T, Hkv, D]: q and k normed and rotated."""
    head_dim = q_norm_weight.shape[0]
    qkv = F.linear(rms_norm(x, norm_weight, eps), qkv_weight)  # [T, (H + 2 Hkv) D]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q = rotate(rms_norm(q.unflatten(-1, (num_heads, head_dim)), q_norm_weight, eps), cos, sin)
    k = rotate(rms_norm(k.unflatten(-1, (num_kv_heads, head_dim)), k_norm_weight, eps), cos, sin)
    return q, k, v.unflatten(-1, (num_kv_heads, head_dim))


def attention_output_mlp(
    x: torch.Tensor,
    attended: torch.Tensor,
    o_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    gate_up_weight: torch.Tensor,
    down_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The residual x [T, hidden] and attention's output [T, H, D] -> the layer's output [T, hidden]."""
    x = x + F.linear(attended.to(x.dtype).flatten(-2), o_weight)
    gate, up = F.linear(rms_norm(x, norm_weight, eps), gate_up_weight).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_weight)


def first_layer_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    embed_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    pre: tuple[torch.Tensor, ...],
    eps: float,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, ...]:
    """The step's start: embeddings x, rotary cos, sin, then the first layer's q, k, v. `pre` is
    that layer's (input norm, q/k/v, q norm, k norm) weights."""
    x, cos, sin = step_inputs(input_ids, positions, embed_weight, inv_freq)
    return (x, cos, sin, *attention_inputs(x, *pre, cos, sin, eps, num_heads, num_kv_heads))


def between_layers(
    x: torch.Tensor,
    attended: torch.Tensor,
    post: tuple[torch.Tensor, ...],
    pre: tuple[torch.Tensor, ...],
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, ...]:
    """One layer's end and the next one's start: its output x (the residual), then the next layer's
    q, k, v. `post` is the layer's (o_proj, post norm, gate/up, down) weights."""
    x = attention_output_mlp(x, attended, *post, eps)
    return (x, *attention_inputs(x, *pre, cos, sin, eps, num_heads, num_kv_heads))


def last_layer_output(
    x: torch.Tensor,
    attended: torch.Tensor,
    post: tuple[torch.Tensor, ...],
    norm_weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The last layer's end and the final norm: hidden states [T, hidden]."""
    return rms_norm(attention_output_mlp(x, attended, *post, eps), norm_weight, eps)


@dataclass
class StepFunctions:
    """What the fused forward calls: these plain functions, or their compiled copies."""

    first_layer_inputs: Callable[..., Any] = first_layer_inputs
    between_layers: Callable[..., Any] = between_layers
    last_layer_output: Callable[..., Any] = last_layer_output


class FusedDecoderLayer(nn.Module):
    """A decoder layer's weights as the fused forward reads them (q/k/v, gate/up concatenated)."""

    def __init__(self, layer: Qwen3DecoderLayer):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.input_layernorm = layer.input_layernorm
        self.qkv_proj = concat_linears([attn.q_proj, attn.k_proj, attn.v_proj])
        del attn.q_proj, attn.k_proj, attn.v_proj  # free them before the next layer's copies
        self.q_norm, self.k_norm, self.o_proj = attn.q_norm, attn.k_norm, attn.o_proj
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.gate_up_proj = concat_linears([mlp.gate_proj, mlp.up_proj])
        del mlp.gate_proj, mlp.up_proj
        self.down_proj = mlp.down_proj

    def pre_weights(self) -> tuple[torch.Tensor, ...]:
        """What attention_inputs reads: input norm, q/k/v, q norm and k norm weights."""
        return self.input_layernorm.weight, self.qkv_proj.weight, self.q_norm.weight, self.k_norm.weight

    def post_weights(self) -> tuple[torch.Tensor, ...]:
        """What attention_output_mlp reads: o_proj, post-attention norm, gate/up and down weights."""
        return (
            self.o_proj.weight,
            self.post_attention_layernorm.weight,
            self.gate_up_proj.weight,
            self.down_proj.weight,
        )


class FusedQwen3(nn.Module):
    """Qwen3ForCausalLM's forward and logits over the fused layers (see the module doc)."""

    def __init__(self, model: Qwen3ForCausalLM):
        super().__init__()
        config = self.config = model.config
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.eps = config.rms_norm_eps
        self.embed_tokens, self.norm, self.lm_head = model.model.embed_tokens, model.model.norm, model.lm_head
        layers = list(model.model.layers)
        model.model.layers = nn.ModuleList()
        self.layers = nn.ModuleList()
        while layers:
            self.layers.append(FusedDecoderLayer(layers.pop(0)))
        device = self.embed_tokens.weight.device
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1.0 / (config.rope_theta ** (exponents / config.head_dim))  # as the reference's
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.functions = StepFunctions()
        # each layer's weight tuples, gathered once: a step's Python loop otherwise pays ~16 module
        # attribute lookups a layer for them (moves and loads keep the Parameter objects)
        self._layer_weights = [(layer.pre_weights(), layer.post_weights()) for layer in self.layers]

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attention: TokenAttention
    ) -> torch.Tensor:
        """input_ids, positions [T] (int64) -> final hidden states [T, hidden] (after the norm)."""
        run, weights, heads = self.functions, self._layer_weights, (self.num_heads, self.num_kv_heads)
        x, cos, sin, q, k, v = run.first_layer_inputs(
            input_ids, positions, self.embed_tokens.weight, self.inv_freq, weights[0][0], self.eps, *heads
        )
        for index in range(len(weights) - 1):
            attended = attention.forward(index, q, k, v)
            post, pre = weights[index][1], weights[index + 1][0]
            x, q, k, v = run.between_layers(x, attended, post, pre, cos, sin, self.eps, *heads)
        attended = attention.forward(len(weights) - 1, q, k, v)
        return run.last_layer_output(x, attended, weights[-1][1], self.norm.weight, self.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()


def optimize(model: Qwen3ForCausalLM) -> FusedQwen3:
    """The loaded eager model as FusedQwen3 (running its plain functions until compile_fused)."""
    return FusedQwen3(model)


def compile_fused(fused: FusedQwen3, mode: str, backend: Any = None) -> Any:
    """Compile each of the fused forward's functions once (`mode`: mstar.engine.compile's, not
    "off"; `backend` replaces inductor, for tests). Returns their CompiledParts: warmup calls them
    at a few token counts, and a compile after `finish_warmup` is a recompile."""
    from mstar.engine.compile import CompiledFunction, CompiledParts

    if mode == "off":
        raise ValueError("compile_fused: mode 'off' keeps the eager reference model; do not fuse")
    parts = []
    for field in fields(StepFunctions):
        part = CompiledFunction(
            getattr(fused.functions, field.name), mode, f"qwen3.{field.name}", dynamic=None,
            backend=backend, fullgraph=True,
        )  # fmt: skip
        setattr(fused.functions, field.name, part)
        parts.append(part)
    return CompiledParts(parts)
