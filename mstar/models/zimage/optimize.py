"""Speed-ups of the Z-Image DiT as one transform over the loaded eager model: `optimize(dit, ...)`.

`fuse` swaps every attention for one with q/k/v as a single GEMM (queries and keys in halves order
per head, so rotary reads contiguous halves; the q/k RMS norms, over one head, take their weights
in that order; scores and so outputs are unchanged) and every SwiGLU for one with the gate and up
projections as one `w13` GEMM. `kernels` (with `fuse`) swaps in the modules that call the
hand-written Triton ops (mstar.engine.kernels): each attention's q/k norm + rotary, and the
modulated stacks (noise refiner, main layers) whose residual updates and the norms after them are
one kernel each, every block handing the next its attention input, and each SwiGLU whose
LoRA-wrapped w13 adds its adapters' expand inside the SwiGLU kernel (mstar::lora_activation) in
steps with adapters. On the CPU the ops are their PyTorch definitions, so each swap is checked
against the eager model there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.lora.activation import fuses_lora, lora_activation
from mstar.models.fusion import concat_linears
from mstar.models.rotary import halves_order
from mstar.models.zimage.dit import ZImageDiT
from mstar.models.zimage.dit_layers import FeedForward, ModulatedBlocks, SelfAttention, per_token


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` with each head's pairs stored as halves (see `halves_order`): the same fp32
    arithmetic per element, from two contiguous halves instead of stride-2 pairs."""
    real, imag = x.float().chunk(2, dim=-1)  # [T, H, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([real * cos - imag * sin, real * sin + imag * cos], dim=-1).type_as(x)


def optimize(dit: ZImageDiT, fuse: bool, kernels: bool) -> ZImageDiT:
    """The same model with its fused (and, with `kernels`, kernel-calling) modules swapped in."""
    if kernels and not fuse:
        raise ValueError("the Z-Image kernels need fused projections (fuse=True)")
    blocks = [*dit.noise_refiner, *dit.context_refiner, *dit.layers]
    if kernels:
        _check_kernels_apply(dit)
        import mstar.engine.kernels.gated_residual_norm  # noqa: F401  registers the ops
        import mstar.engine.kernels.lora_activation  # noqa: F401
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401
    if fuse:
        attention = KernelSelfAttention if kernels else FusedSelfAttention
        feed_forward = KernelFeedForward if kernels else FusedFeedForward
        for block in blocks:
            block.attention = attention(block.attention)
            block.feed_forward = feed_forward(block.feed_forward)
    if kernels:
        dit.noise_refiner = KernelModulatedBlocks(list(dit.noise_refiner))
        dit.layers = KernelModulatedBlocks(list(dit.layers))
    return dit


def _check_kernels_apply(dit: ZImageDiT) -> None:
    for block in [*dit.noise_refiner, *dit.context_refiner, *dit.layers]:
        if block.attention.norm_q is None or block.attention.norm_k is None:
            raise ValueError("the q/k kernel needs q/k norms (qk_norm)")
    for block in [*dit.noise_refiner, *dit.layers]:
        norms = (block.attention_norm1, block.attention_norm2, block.ffn_norm1, block.ffn_norm2)
        if len({norm.eps for norm in norms}) != 1:
            raise ValueError("the norm kernel needs a modulated block whose norms share one eps")


class FusedSelfAttention(SelfAttention):
    """q/k/v as one `to_qkv` GEMM, queries and keys in halves order; built from a loaded attention,
    whose separate weights are dropped with it."""

    def __init__(self, unfused: SelfAttention):
        nn.Module.__init__(self)
        self.n_heads = unfused.n_heads
        head_dim = unfused.to_q.out_features // self.n_heads
        order = halves_order(self.n_heads, head_dim).to(unfused.to_q.weight.device)
        with torch.no_grad():
            for linear in (unfused.to_q, unfused.to_k):
                linear.weight.copy_(linear.weight[order])
            for norm in (unfused.norm_q, unfused.norm_k):
                if norm is not None:
                    norm.weight.copy_(norm.weight[order[:head_dim]])
        self.to_qkv = concat_linears([unfused.to_q, unfused.to_k, unfused.to_v])
        self.to_out, self.norm_q, self.norm_k = unfused.to_out, unfused.norm_q, unfused.norm_k

    def project(self, x):
        return self.to_qkv(x).unflatten(-1, (3, self.n_heads, -1)).unbind(-3)  # [T, 3, H, D]

    def norm_rotate(self, q, k, rope):
        if self.norm_q is not None:
            q = self.norm_q(q)
        if self.norm_k is not None:
            k = self.norm_k(k)
        cos, sin = rope
        return apply_rotary_halves(q, cos, sin), apply_rotary_halves(k, cos, sin)


class KernelSelfAttention(FusedSelfAttention):
    """Fused attention whose per-head q/k RMS norm and rotary are one Triton kernel each for queries
    and keys (mstar::qk_norm_rotary)."""

    def norm_rotate(self, q, k, rope):
        cos, sin = rope  # [T, D/2] fp32
        op = torch.ops.mstar.qk_norm_rotary
        return (
            op(q, self.norm_q.weight, cos, sin, self.norm_q.eps, "head"),
            op(k, self.norm_k.weight, cos, sin, self.norm_k.eps, "head"),
        )


class FusedFeedForward(FeedForward):
    """SwiGLU with the gate (w1) and up (w3) projections as one `w13` GEMM."""

    def __init__(self, unfused: FeedForward):
        nn.Module.__init__(self)
        self.w13 = concat_linears([unfused.w1, unfused.w3])
        self.w2 = unfused.w2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).unflatten(-1, (2, -1)).unbind(-2)  # [T, 2, hidden] -> 2 x [T, hidden]
        return self.w2(F.silu(gate) * up)


class KernelFeedForward(FusedFeedForward):
    """The fused SwiGLU whose w13, LoRA-wrapped on the "activation" path, adds the step's adapters
    inside the SwiGLU kernel (gate and up slices): no [T, 2 * hidden] delta is written or read. The
    LoRA targets give w13 the path where `fuses_lora_activation` says the module can."""

    fuses_lora_activation = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fuses_lora(self.w13):
            return self.w2(lora_activation(self.w13, x, "swiglu"))
        return super().forward(x)


class KernelModulatedBlocks(ModulatedBlocks):
    """ModulatedBlocks through mstar::gated_residual_rms_norm: each block hands the next its
    attention input, normed and scaled in the same kernel as its last residual update."""

    def forward(self, x, rope, attn, label: str, item_emb, token_item) -> torch.Tensor:
        if token_item is None:
            token_item = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        rows = [block.modulation_rows(item_emb) for block in self]
        h = self[0].attention_norm1(x) * per_token(rows[0][0], token_item)
        for index, block in enumerate(self):
            is_last = index + 1 == len(self)
            next_norm = None if is_last else self[index + 1].attention_norm1
            next_scale = None if is_last else rows[index + 1][0]
            x, h = _kernel_block(
                block, x, h, rows[index], rope, attn, label, token_item, next_norm, next_scale
            )
        return x


def _kernel_block(block, x, h, rows, rope, attn, label: str, token_item, next_norm, next_scale):
    """One modulated block with the residual kernel. x [T, dim] the residual, h [T, dim] its
    attention input (normed and scaled). Returns (x after the block, the next block's attention
    input: normed by next_norm and scaled by next_scale rows; empty [0, dim] for the last block)."""
    _, gate_msa, scale_mlp, gate_mlp = rows  # [num_items, dim] each
    gated_norm = torch.ops.mstar.gated_residual_rms_norm
    eps = block.ffn_norm1.eps
    attn_out = block.attention(h, rope, attn, label)
    x, h = gated_norm(
        x,
        attn_out,
        gate_msa,
        block.attention_norm2.weight,
        block.ffn_norm1.weight,
        scale_mlp,
        token_item,
        eps,
    )
    next_weight = None if next_norm is None else next_norm.weight
    return gated_norm(
        x, block.feed_forward(h), gate_mlp, block.ffn_norm2.weight, next_weight, next_scale, token_item, eps
    )
