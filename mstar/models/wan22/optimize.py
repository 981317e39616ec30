"""Speed-ups of the Wan DiT as one transform over the loaded eager model: `optimize(dit, ...)`.

    dit = build_module(lambda: WanDiT(config), device, dtype, folder)   # diffusers' keys
    dit = optimize(dit, fuse=True, kernels=True)                        # after loading, before compile

`fuse` swaps each block's attention for fused modules: self attention's q/k/v as one GEMM with its
queries and keys stored in halves order (rotary then reads contiguous halves; scores are dot
products over a head, the same in any common feature order, and values keep theirs), cross
attention's k/v as one GEMM. `kernels` (with `fuse`) swaps in the modules that call the
hand-written Triton ops (mstar.engine.kernels): the q/k RMS norm + rotary, and a block stack whose
residual updates and the norms after them are one kernel each, every block handing the next (and
the last the output head) its normed, modulated input, and an FFN whose LoRA-wrapped first Linear
adds its adapters' expand inside the GELU kernel (mstar::lora_activation) in steps with adapters.
On the CPU the ops are their PyTorch definitions, so each swap is checked against the eager model
there. The model file stays the eager reference; nothing here changes its arithmetic beyond the
order of GEMM columns.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.engine.lora.activation import fuses_lora, lora_activation
from mstar.models.fusion import concat_linears
from mstar.models.rotary import halves_order
from mstar.models.wan22.dit import WanDiT
from mstar.models.wan22.dit_layers import FeedForward, WanAttention, WanBlocks


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The interleaved-pair rotation with each head's pairs stored as halves (evens first, then odds:
    `halves_order`): contiguous loads instead of stride-2 ones. x [T, H, D]; cos/sin [T, 1, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


def optimize(dit: WanDiT, fuse: bool, kernels: bool) -> WanDiT:
    """The same model with its fused (and, with `kernels`, kernel-calling) modules swapped in."""
    if kernels and not fuse:
        raise ValueError("the Wan kernels need fused projections (fuse=True)")
    if kernels and any(block.norm2 is None for block in dit.blocks):
        raise ValueError("the norm kernel needs the cross-attention norm (cross_attn_norm)")
    if fuse:
        self_attention = KernelSelfAttention if kernels else FusedSelfAttention
        for block in dit.blocks:
            block.attn1 = self_attention(block.attn1)
            block.attn2 = FusedCrossAttention(block.attn2)
    if kernels:
        import mstar.engine.kernels.lora_activation  # noqa: F401  registers the ops
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401
        import mstar.engine.kernels.residual_layer_norm  # noqa: F401

        for block in dit.blocks:
            block.ffn = KernelFeedForward(block.ffn)
        dit.blocks = KernelBlocks(list(dit.blocks), dit.blocks.eps)
    return dit


class FusedSelfAttention(WanAttention):
    """Self attention with q/k/v as one `to_qkv` GEMM (queries and keys in halves order); built from
    a loaded WanAttention, whose separate weights are dropped with it."""

    def __init__(self, unfused: WanAttention):
        nn.Module.__init__(self)
        self.heads = unfused.heads
        order = halves_order(self.heads, unfused.to_q.out_features // self.heads).to(
            unfused.to_q.weight.device
        )
        with torch.no_grad():
            for module in (unfused.to_q, unfused.to_k, unfused.norm_q, unfused.norm_k):
                module.weight.copy_(module.weight[order])
            for module in (unfused.to_q, unfused.to_k):
                if module.bias is not None:
                    module.bias.copy_(module.bias[order])
        self.to_qkv = concat_linears([unfused.to_q, unfused.to_k, unfused.to_v])
        self.to_out, self.norm_q, self.norm_k = unfused.to_out, unfused.norm_q, unfused.norm_k

    def project_self(self, x):
        return self.to_qkv(x).unflatten(-1, (3, -1)).unbind(-2)  # [T, 3, dim] -> 3 x [T, dim]

    def norm_rotate(self, query, key, rotary):
        heads = (self.heads, -1)
        key = self.norm_k(key)
        query = self.norm_q(query).unflatten(-1, heads)
        key = key.unflatten(-1, heads)
        return apply_rotary_halves(query, *rotary), apply_rotary_halves(key, *rotary)

    def context_key_value(self, context):
        raise ValueError("fused q/k/v is self attention's: it has no separate context keys/values")


class KernelSelfAttention(FusedSelfAttention):
    """Fused self attention whose q/k RMS norm (over the whole row) and rotary are one Triton kernel
    each for queries and keys (mstar::qk_norm_rotary)."""

    def norm_rotate(self, query, key, rotary):
        heads = (self.heads, -1)
        cos, sin = (table.flatten(1) for table in rotary)  # [T, 1, D/2] -> [T, D/2]
        op = torch.ops.mstar.qk_norm_rotary
        return (
            op(query.unflatten(-1, heads), self.norm_q.weight, cos, sin, self.norm_q.eps, "row"),
            op(key.unflatten(-1, heads), self.norm_k.weight, cos, sin, self.norm_k.eps, "row"),
        )


class FusedCrossAttention(WanAttention):
    """Cross attention with k/v as one `to_kv` GEMM over the text."""

    def __init__(self, unfused: WanAttention):
        nn.Module.__init__(self)
        self.heads = unfused.heads
        self.to_q, self.to_out = unfused.to_q, unfused.to_out
        self.norm_q, self.norm_k = unfused.norm_q, unfused.norm_k
        self.to_kv = concat_linears([unfused.to_k, unfused.to_v])

    def project_self(self, x):
        raise ValueError("fused k/v is cross attention's: it takes context_kv, not self attention")

    def context_key_value(self, context):
        key, value = self.to_kv(context).unflatten(-1, (2, -1)).unbind(-2)  # [Tkv, 2, dim]
        return self.norm_k(key), value


class KernelFeedForward(FeedForward):
    """The FFN (same modules and keys) whose first Linear, LoRA-wrapped on the "activation" path,
    adds the step's adapters inside the GELU kernel: no [T, inner] delta is written or read. The
    LoRA targets give that Linear the path where `fuses_lora_activation` says the FFN can."""

    fuses_lora_activation = True

    def __init__(self, plain: FeedForward):
        nn.Module.__init__(self)
        self.net = plain.net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        proj = self.net[0].proj
        if fuses_lora(proj):
            return self.net[2](lora_activation(proj, x, "gelu_tanh"))
        return super().forward(x)


class KernelBlocks(WanBlocks):
    """WanBlocks through mstar::residual_layer_norm: each residual update and the LayerNorm after it
    (the cross-attention norm's affine, or the next timestep modulation) in one kernel, three a
    block; the FFN's residual gives the next block's (or the output head's) modulated input."""

    def forward(self, tokens, text_kv, modulation_rows, head_rows, row_index, rotary, attention):
        tables = [_modulation_tables(block, modulation_rows) for block in self]
        head_shift, head_scale = head_rows
        next_rows = [(following[1], following[0]) for following in tables[1:]] + [
            (1 + head_scale, head_shift)
        ]
        norm = torch.ops.mstar.residual_layer_norm
        _, h = norm(tokens, None, None, None, None, tables[0][1], tables[0][0], row_index, self.eps)
        for index, block in enumerate(self):
            next_scale, next_shift = next_rows[index]
            tokens, h = _kernel_block(
                block,
                tokens,
                h,
                tables[index],
                next_scale,
                next_shift,
                text_kv[index],
                row_index,
                rotary,
                attention,
            )
        return h


def _modulation_tables(block, modulation_rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-item float32 rows [R, dim]: shift, 1 + scale, gate of self attention, then of the FFN."""
    shift, scale, gate, c_shift, c_scale, c_gate = (block.scale_shift_table + modulation_rows.float()).unbind(
        1
    )
    return shift, 1 + scale, gate, c_shift, 1 + c_scale, c_gate


def _kernel_block(block, x, h, tables, next_scale, next_shift, text_kv, row_index, rotary, attention):
    """One WanBlock with the residual kernel. x [T, dim] the residual, h [T, dim] this block's
    self-attention input (normed and modulated). Returns (x after the block, the next input: normed
    and modulated by the next_scale / next_shift rows [R, dim])."""
    _, _, gate, c_shift, c_scale, c_gate = tables
    norm = torch.ops.mstar.residual_layer_norm
    attn_out = block.attn1(h, attention, "self", rotary)
    x, normed = norm(
        x, attn_out, gate, block.norm2.weight, block.norm2.bias, None, None, row_index, block.eps
    )
    cross_out = block.attn2(normed, attention, "cross", context_kv=text_kv)
    x, normed = norm(x, cross_out, None, None, None, c_scale, c_shift, row_index, block.eps)
    return norm(x, block.ffn(normed), c_gate, None, None, next_scale, next_shift, row_index, block.eps)
