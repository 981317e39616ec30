"""The FLUX.2 DiT's modules that call the hand-written Triton ops (mstar.engine.kernels), swapped in
by optimize(fuse=True, kernels=True) over the fused ones:

- every attention's q/k RMS norm (per head, float32 as torch's nn.RMSNorm) and rotary: one
  mstar::qk_norm_rotary call each for a single block's queries and keys, read in place from its
  fused projection; in a double block one mstar::joint_qk_norm_rotary call each, which reads the
  text and image streams' projections and writes the joint order directly (no concatenation of
  the streams' queries and keys first);
- each stack's residual updates with the LayerNorm and modulation after them: one
  mstar::residual_layer_norm call per update, each block handing the next its attention input
  (the modulation rows are gathered per token inside the kernel, never materialised per token).

The ops compute in float32 with one rounding where the eager code rounds each product; on the CPU
they are their PyTorch definitions, so each swap is checked against the eager model there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar.models.flux2_klein.dit_layers import DoubleStreamBlocks, SingleStreamBlocks, per_token, swiglu
from mstar.models.flux2_klein.optimize import FusedJointAttention, FusedParallelSelfAttention

NORM_SCOPE = "head_fp32"  # FLUX.2's q/k norms: nn.RMSNorm over each head


class KernelJointAttention(FusedJointAttention):
    """Fused joint attention whose queries and keys come normed, rotated and in the joint order
    from one kernel per kind; the values still meet in one gather. Built as FusedJointAttention."""

    def forward(self, txt, img, packed, attn) -> tuple[torch.Tensor, torch.Tensor]:
        """txt [Tt, dim], img [Ti, dim] (normed, modulated) -> their attention outputs."""
        txt_q, txt_k, txt_v = self.add_qkv(txt).unflatten(-1, (3, -1, self.head_dim)).unbind(1)
        img_q, img_k, img_v = self.to_qkv(img).unflatten(-1, (3, -1, self.head_dim)).unbind(1)
        op, rows = torch.ops.mstar.joint_qk_norm_rotary, packed.maps.joint_order
        query = op(
            txt_q, img_q, self.norm_added_q.weight, self.norm_q.weight, packed.cos, packed.sin, rows,
            self.norm_q.eps, NORM_SCOPE,
        )  # fmt: skip
        key = op(
            txt_k, img_k, self.norm_added_k.weight, self.norm_k.weight, packed.cos, packed.sin, rows,
            self.norm_k.eps, NORM_SCOPE,
        )  # fmt: skip
        out = attn.run(packed.label, query, key, packed.joint(txt_v, img_v)).flatten(1).to(query.dtype)
        txt_out, img_out = packed.streams(out, txt.shape[0])
        return self.to_add_out(txt_out), self.to_out[0](img_out)


class KernelParallelSelfAttention(FusedParallelSelfAttention):
    """The single blocks' fused attention with its q/k norm + rotary one kernel each, reading the
    queries and keys where the fused projection wrote them. Built as FusedParallelSelfAttention."""

    def forward(self, x: torch.Tensor, packed, attn) -> torch.Tensor:
        qkv, mlp = self.to_qkv_mlp_proj(x).split([3 * self.inner_dim, 2 * self.mlp_hidden_dim], dim=-1)
        query, key, value = qkv.unflatten(-1, (3, -1, self.head_dim)).unbind(1)  # [T, H, D] views
        op = torch.ops.mstar.qk_norm_rotary
        query = op(query, self.norm_q.weight, packed.cos, packed.sin, self.norm_q.eps, NORM_SCOPE)
        key = op(key, self.norm_k.weight, packed.cos, packed.sin, self.norm_k.eps, NORM_SCOPE)
        out = attn.run(packed.label, query, key, value).flatten(1).to(query.dtype)
        return self.to_out(torch.cat([out, swiglu(mlp)], dim=-1))


@dataclass(frozen=True)
class StreamRows:
    """One stream's modulation rows per item for the kernel, float32 [num_items, dim] each (the
    scales with their 1 added, as eager adds it), and each token's item [T]."""

    attention_scale: torch.Tensor
    attention_shift: torch.Tensor
    attention_gate: torch.Tensor
    ffn_scale: torch.Tensor
    ffn_shift: torch.Tensor
    ffn_gate: torch.Tensor
    token_item: torch.Tensor

    @classmethod
    def of(cls, rows: torch.Tensor, token_item: torch.Tensor | None, x: torch.Tensor) -> StreamRows:
        """rows [num_items, 6 * dim]: (shift, scale, gate) for attention, then for the FFN."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = rows.chunk(6, dim=-1)
        return cls(
            _fp32(1 + scale_msa), _fp32(shift_msa), _fp32(gate_msa),
            _fp32(1 + scale_mlp), _fp32(shift_mlp), _fp32(gate_mlp), _token_items(token_item, x),
        )  # fmt: skip


def _fp32(rows: torch.Tensor) -> torch.Tensor:
    return rows.float().contiguous()


def _token_items(token_item: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """Each token's item (all 0 for a single item, whose rows are one)."""
    if token_item is not None:
        return token_item
    return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


def _update(x, y, gate, scale, shift, token_item, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + y * gate, LayerNorm of it * scale + shift) per token, one kernel; without y only the norm
    of x (x comes back as it was)."""
    x_new, h = torch.ops.mstar.residual_layer_norm(x, y, gate, None, None, scale, shift, token_item, eps)
    return (x if y is None else x_new), h


def _attention_norm(x, rows: StreamRows, eps: float) -> torch.Tensor:
    """The first block's attention input: x normed and modulated."""
    return _update(x, None, None, rows.attention_scale, rows.attention_shift, rows.token_item, eps)[1]


def _attention_update(x, y, rows: StreamRows, eps: float):
    """After attention: the residual update, then the FFN's modulated norm."""
    return _update(x, y, rows.attention_gate, rows.ffn_scale, rows.ffn_shift, rows.token_item, eps)


def _ffn_update(x, y, rows: StreamRows, eps: float):
    """After the FFN: the residual update, then the next block's attention norm (same rows)."""
    return _update(x, y, rows.ffn_gate, rows.attention_scale, rows.attention_shift, rows.token_item, eps)


class KernelDoubleStreamBlocks(DoubleStreamBlocks):
    """The double-stream stack through mstar::residual_layer_norm: each residual update and the
    norm after it (the next block's attention norm after an FFN) are one kernel per stream."""

    def forward(self, txt, img, rows, packed, attn) -> tuple[torch.Tensor, torch.Tensor]:
        maps, eps = packed.maps, self[0].norm1.eps
        txt_rows = StreamRows.of(rows.text, maps.text_item, txt)
        img_rows = StreamRows.of(rows.image, maps.image_item, img)
        h_txt, h_img = _attention_norm(txt, txt_rows, eps), _attention_norm(img, img_rows, eps)
        for index, block in enumerate(self):
            txt_attn, img_attn = block.attn(h_txt, h_img, packed, attn)
            txt, h_txt = _attention_update(txt, txt_attn, txt_rows, eps)
            img, h_img = _attention_update(img, img_attn, img_rows, eps)
            txt_ffn, img_ffn = block.ff_context(h_txt), block.ff(h_img)
            if index + 1 < len(self):
                txt, h_txt = _ffn_update(txt, txt_ffn, txt_rows, eps)
                img, h_img = _ffn_update(img, img_ffn, img_rows, eps)
            else:  # the joint order comes next, normed by the single stack; the update as eager
                txt = txt + per_token(rows.text.chunk(6, dim=-1)[5], maps.text_item) * txt_ffn
                img = img + per_token(rows.image.chunk(6, dim=-1)[5], maps.image_item) * img_ffn
        return txt, img


class KernelSingleStreamBlocks(SingleStreamBlocks):
    """The single-stream stack through mstar::residual_layer_norm: each block's residual update
    and the next block's modulated norm are one kernel."""

    def forward(self, joint: torch.Tensor, rows, packed, attn) -> torch.Tensor:
        shift, scale, gate = rows.single.chunk(3, dim=-1)
        scale_rows, shift_rows, gate_rows = _fp32(1 + scale), _fp32(shift), _fp32(gate)
        items, eps = _token_items(packed.maps.joint_item, joint), self[0].norm.eps
        _, h = _update(joint, None, None, scale_rows, shift_rows, items, eps)
        for index, block in enumerate(self):
            y = block.attn(h, packed, attn)
            if index + 1 < len(self):
                joint, h = _update(joint, y, gate_rows, scale_rows, shift_rows, items, eps)
            else:  # the output norm reads the output tokens only; the update as eager
                joint = joint + per_token(gate, packed.maps.joint_item) * y
        return joint
