"""Speed-ups of the FLUX.2 DiT as one transform over the loaded eager model: `optimize(dit, ...)`.

    dit = build_dit(config, device, dtype, model_path)   # diffusers' keys
    dit = optimize(dit, fuse=True, kernels=False)        # after loading, before compile

`fuse` swaps every double-stream block's joint attention for one whose image q/k/v are one `to_qkv`
GEMM and text q/k/v one `add_qkv` GEMM, the three meeting in the joint order with one gather, and
every single-stream block's attention for one whose fused qkv+MLP projection holds its queries and
keys in rotary halves order (mstar.models.rotary): rotary then reads two contiguous halves, for
queries and keys in one pass. Scores are dot products over a head, the same in any common feature
order; the per-head q/k RMS norms take their weights in that order; values (and so outputs) keep
theirs. The FFNs' gate and up projections are one `linear_in` in the checkpoint already.

`kernels` (with `fuse`; the server's triton_kernels option) swaps in the modules that call the
hand-written Triton ops (mstar.models.flux2_klein.kernel_blocks): the q/k norms + rotary, and both
stacks' residual updates with the modulated LayerNorms after them.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.models.flux2_klein.dit import Flux2DiT
from mstar.models.flux2_klein.dit_layers import JointAttention, ParallelSelfAttention, swiglu
from mstar.models.fusion import concat_linears
from mstar.models.rotary import halves_order


def optimize(dit: Flux2DiT, fuse: bool, kernels: bool) -> Flux2DiT:
    """The same model with its fused (and, with `kernels`, kernel-calling) modules swapped in (in
    place; the unfused weights are dropped)."""
    if kernels and not fuse:
        raise ValueError("the FLUX.2 kernels need fused projections (fuse=True)")
    joint, parallel = FusedJointAttention, FusedParallelSelfAttention
    if kernels:
        import mstar.engine.kernels.qk_norm_rotary  # noqa: F401  registers the ops
        import mstar.engine.kernels.residual_layer_norm  # noqa: F401
        from mstar.models.flux2_klein import kernel_blocks

        joint, parallel = kernel_blocks.KernelJointAttention, kernel_blocks.KernelParallelSelfAttention
    if fuse:
        for block in dit.transformer_blocks:
            block.attn = joint(block.attn)
        for block in dit.single_transformer_blocks:
            block.attn = parallel(block.attn)
    if kernels:
        dit.transformer_blocks = kernel_blocks.KernelDoubleStreamBlocks(list(dit.transformer_blocks))
        dit.single_transformer_blocks = kernel_blocks.KernelSingleStreamBlocks(
            list(dit.single_transformer_blocks)
        )
    return dit


def apply_rotary_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` with each head's pairs stored as halves (`halves_order`): the same fp32
    arithmetic per element, from two contiguous halves. x [T, ..., D]; cos/sin [T, D/2] fp32."""
    real, imag = x.float().chunk(2, dim=-1)
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    cos, sin = cos.view(shape), sin.view(shape)
    return torch.cat([real * cos - imag * sin, imag * cos + real * sin], dim=-1).to(x.dtype)


def _to_halves(linear: nn.Linear, rows: slice, order: torch.Tensor) -> None:
    """Permutes the output rows `rows` of a bias-free Linear into `order` (relative to rows.start)."""
    with torch.no_grad():
        block = linear.weight[rows]
        block.copy_(block[order])


def _norm_to_halves(norm: nn.RMSNorm, head_order: torch.Tensor) -> None:
    with torch.no_grad():
        norm.weight.copy_(norm.weight[head_order])


class FusedJointAttention(JointAttention):
    """Joint attention with each stream's q/k/v as one GEMM (queries and keys in halves order); built
    from a loaded JointAttention, whose separate weights are dropped with it."""

    def __init__(self, unfused: JointAttention):
        nn.Module.__init__(self)
        self.head_dim = unfused.head_dim
        inner = unfused.to_q.out_features
        order = halves_order(inner // self.head_dim, self.head_dim).to(unfused.to_q.weight.device)
        for linear in (unfused.to_q, unfused.to_k, unfused.add_q_proj, unfused.add_k_proj):
            _to_halves(linear, slice(0, inner), order)
        for norm in (unfused.norm_q, unfused.norm_k, unfused.norm_added_q, unfused.norm_added_k):
            _norm_to_halves(norm, order[: self.head_dim])
        self.to_qkv = concat_linears([unfused.to_q, unfused.to_k, unfused.to_v])
        self.add_qkv = concat_linears([unfused.add_q_proj, unfused.add_k_proj, unfused.add_v_proj])
        self.norm_q, self.norm_k = unfused.norm_q, unfused.norm_k
        self.norm_added_q, self.norm_added_k = unfused.norm_added_q, unfused.norm_added_k
        self.to_out, self.to_add_out = unfused.to_out, unfused.to_add_out

    def _stream(self, x: torch.Tensor, qkv: nn.Linear, norm_q: nn.RMSNorm, norm_k: nn.RMSNorm):
        """x [T, dim] -> [T, 3, H, D]: normed queries and keys, then values."""
        query, key, value = qkv(x).unflatten(-1, (3, -1, self.head_dim)).unbind(1)  # [T, H, D] each
        return torch.stack([norm_q(query), norm_k(key), value], dim=1)

    def forward(self, txt, img, packed, attn) -> tuple[torch.Tensor, torch.Tensor]:
        """txt [Tt, dim], img [Ti, dim] (normed, modulated) -> their attention outputs."""
        joint = packed.joint(
            self._stream(txt, self.add_qkv, self.norm_added_q, self.norm_added_k),
            self._stream(img, self.to_qkv, self.norm_q, self.norm_k),
        )  # [T, 3, H, D], joint order
        query, key = apply_rotary_halves(joint[:, :2], packed.cos, packed.sin).unbind(1)
        out = attn.run(packed.label, query, key, joint[:, 2]).flatten(1).to(query.dtype)  # [T, H * D]
        txt_out, img_out = packed.streams(out, txt.shape[0])
        return self.to_add_out(txt_out), self.to_out[0](img_out)


class FusedParallelSelfAttention(ParallelSelfAttention):
    """The single-stream blocks' attention with the queries and keys of its fused projection in
    halves order, rotated in one pass; built from a loaded ParallelSelfAttention (weights reused)."""

    def __init__(self, unfused: ParallelSelfAttention):
        nn.Module.__init__(self)
        self.head_dim, self.inner_dim = unfused.head_dim, unfused.inner_dim
        self.mlp_hidden_dim = unfused.mlp_hidden_dim
        inner = self.inner_dim
        weight = unfused.to_qkv_mlp_proj.weight
        order = halves_order(inner // self.head_dim, self.head_dim).to(weight.device)
        for start in (0, inner):  # queries, then keys
            _to_halves(unfused.to_qkv_mlp_proj, slice(start, start + inner), order)
        for norm in (unfused.norm_q, unfused.norm_k):
            _norm_to_halves(norm, order[: self.head_dim])
        self.to_qkv_mlp_proj, self.to_out = unfused.to_qkv_mlp_proj, unfused.to_out
        self.norm_q, self.norm_k = unfused.norm_q, unfused.norm_k

    def forward(self, x: torch.Tensor, packed, attn) -> torch.Tensor:
        qkv, mlp = self.to_qkv_mlp_proj(x).split([3 * self.inner_dim, 2 * self.mlp_hidden_dim], dim=-1)
        query, key, value = qkv.unflatten(-1, (3, -1, self.head_dim)).unbind(1)  # [T, H, D] each
        query_key = torch.stack([self.norm_q(query), self.norm_k(key)], dim=1)  # [T, 2, H, D]
        query, key = apply_rotary_halves(query_key, packed.cos, packed.sin).unbind(1)
        out = attn.run(packed.label, query, key, value).flatten(1).to(query.dtype)
        return self.to_out(torch.cat([out, swiglu(mlp)], dim=-1))
