"""Speed-ups of the LTX-2 DiT as one transform over the loaded eager model: `optimize(dit, ...)`.

    dit = weights.build_dit(config, device, dtype, folder)     # diffusers' keys, the eager model
    dit = optimize(dit, fuse=True, kernels=True)               # after loading, before compile

`fuse` gives each block's video and audio self attention one q/k/v GEMM (the three projections'
weights side by side, split after the GEMM): three reads of the same activations become one (the
video stream's at the released size: one 4096 x 12288 GEMM instead of three 4096 x 4096). Each
output element is computed as in the eager model.

`kernels` swaps the q/k RMS norm and split-layout rotary of every attention with rotary (both
streams' self attention, the audio-video cross attention) for the hand-written Triton op
mstar::qk_norm_rotary with per-head tables, one call each for queries and keys. Inductor's fused
kernel for it re-reads rows to pair each head's halves: on the H200 (768x512x121 guided step) the
video self attention's query and key took 0.54 and 0.34 ms a block; the op's eight calls a block
take 0.38 ms together, and the step went from 1,001 to 960 ms. On the CPU the op is its
PyTorch definition, so the swap is checked against the eager model there. The interleaved layout
(no such op) keeps the eager code.

`kernels` also writes each feed-forward's tanh GELU as x * sigmoid(2u), u = sqrt(2/pi) (x +
0.044715 x^3): the same function (0.5 (1 + tanh u) = sigmoid(2u)), which a GPU computes in fewer
instructions than libdevice's tanh. Inductor's GELU kernel over the [T, 4 * dim] activations took
21.5 ms of the 960 ms step on the H200 (448 us a call, where reading and writing the tensor takes
about 300 us); by an instruction count, not yet a measurement, the tanh rather than the memory
bounds it. In float32 the two forms differ by at most 5e-7 (the sigmoid form is the more exact for
negative x, where 1 + tanh u cancels).
"""

from __future__ import annotations

import math

import torch

from mstar.models.fusion import concat_linears
from mstar.models.ltx2.dit import LTX2DiT
from mstar.models.ltx2.dit_layers import Attention, GeluProj

TWO_SQRT_2_OVER_PI = 2.0 * math.sqrt(2.0 / math.pi)


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


class _KernelNormRotary:
    """norm_rotate through mstar::qk_norm_rotary where the rotary is split-layout (per-head tables
    [T, H, D/2]); the eager code otherwise."""

    def norm_rotate(self, query, key, query_rope, key_rope):
        if query_rope is None or query_rope[0].dim() != 3:
            return super().norm_rotate(query, key, query_rope, key_rope)
        key_rope = query_rope if key_rope is None else key_rope
        return self._normed_rotated(query, self.norm_q, query_rope), self._normed_rotated(
            key, self.norm_k, key_rope
        )

    def _normed_rotated(self, x: torch.Tensor, norm, rope) -> torch.Tensor:
        cos, sin = rope  # [T, H, D/2] float32
        heads = x.unflatten(-1, (self.heads, -1))  # [T, inner] -> [T, H, D]: any row stride
        return torch.ops.mstar.qk_norm_rotary(heads, norm.weight, cos, sin, norm.eps, "row").flatten(1)


class KernelAttention(_KernelNormRotary, Attention):
    """Attention (separate q/k/v) whose q/k norm and rotary are the Triton op."""


class KernelFusedSelfAttention(_KernelNormRotary, FusedSelfAttention):
    """Fused self attention whose q/k norm and rotary are the Triton op."""


class SigmoidGeluProj(GeluProj):
    """gelu(x @ W.T + b, tanh) computed as h * sigmoid(2u) in float32 (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = self.proj(x)
        h = projected.float()
        twice_u = h * (TWO_SQRT_2_OVER_PI + (TWO_SQRT_2_OVER_PI * 0.044715) * h * h)
        return (h * torch.sigmoid(twice_u)).to(projected.dtype)


def optimize(dit: LTX2DiT, fuse: bool, kernels: bool) -> LTX2DiT:
    """The same model with fused self-attention projections (`fuse`), the q/k norm + rotary op and
    the feed-forward's GELU in its sigmoid form (`kernels`)."""
    if kernels:
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401  registers the op
    for block in dit.transformer_blocks:
        for name in ("attn1", "audio_attn1"):
            module = getattr(block, name)
            if fuse:
                module = FusedSelfAttention.fuse(module)
            if kernels:
                module.__class__ = KernelFusedSelfAttention if fuse else KernelAttention
        if kernels:
            block.audio_to_video_attn.__class__ = KernelAttention
            block.video_to_audio_attn.__class__ = KernelAttention
            for feed_forward in (block.ff, block.audio_ff):
                feed_forward.net[0].__class__ = SigmoidGeluProj
    return dit
