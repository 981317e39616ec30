"""Speed-ups of the LTX-2 DiT as one transform over the loaded eager model: `optimize(dit, ...)`.

    dit = weights.build_dit(config, device, dtype, folder)     # diffusers' keys, the eager model
    dit = optimize(dit, fuse=True, kernels=False)              # after loading, before compile

`fuse` gives each block's video and audio self attention one q/k/v GEMM (the three projections'
weights side by side, split after the GEMM): three reads of the same activations become one (the
video stream's at the released size: one 4096 x 12288 GEMM instead of three 4096 x 4096). Each
output element is computed as in the eager model. LTX-2 has no hand-written kernels yet: `kernels`
changes nothing.
"""

from __future__ import annotations

from mstar.models.fusion import concat_linears
from mstar.models.ltx2.dit import LTX2DiT
from mstar.models.ltx2.dit_layers import Attention


class FusedSelfAttention(Attention):
    """Attention whose self-attention q, k and v come from one fused Linear (`to_qkv`)."""

    @classmethod
    def fuse(cls, module: Attention) -> FusedSelfAttention:
        """The module itself, its q/k/v Linears replaced by one (the originals are freed)."""
        module.to_qkv = concat_linears([module.to_q, module.to_k, module.to_v])
        del module.to_q, module.to_k, module.to_v
        module.__class__ = cls
        return module

    def forward(self, x, attention, label, context=None, query_rope=None, key_rope=None, value_rows=None):
        if context is not None:
            raise ValueError("fused q/k/v is self attention only")
        query, key, value = self.to_qkv(x).chunk(3, dim=-1)
        return self.attend(x, query, key, value, attention, label, query_rope, key_rope, value_rows)


def optimize(dit: LTX2DiT, fuse: bool, kernels: bool) -> LTX2DiT:
    """The same model with fused self-attention projections (`fuse`)."""
    if not fuse:
        return dit
    for block in dit.transformer_blocks:
        block.attn1 = FusedSelfAttention.fuse(block.attn1)
        block.audio_attn1 = FusedSelfAttention.fuse(block.audio_attn1)
    return dit
