"""`mstar::qk_norm_rotary`: a DiT's query/key RMS norm and rotary embedding as one Triton kernel.

Inductor fuses the norm and the rotation of each head but re-reads every row to pair a head's two
halves: on the H200 the fused kernel ran at about a quarter of memory speed (Wan 480p guidance pair:
195 us per layer; Z-Image 1024: 79 us). Here one program holds a token's whole row in registers as
[heads, 2, D/2] halves, reduces it, scales it and rotates it, reading and writing each element once.

Layout: each head's rotary pairs stored as halves (mstar.models.rotary.halves_order). The norm runs
over the whole row (Wan: RMSNorm over all heads) or over each head, with the roundings of the
models' PyTorch code, which stays the reference (`qk_norm_rotary_reference`, and the CPU impl):
- "row": over all heads, float32 throughout, one rounding (torch's nn.RMSNorm, as Wan's);
- "head": over each head, the normed value rounded, then its product with the weight (Z-Image's);
- "head_fp32": over each head, float32 throughout, one rounding (torch's nn.RMSNorm over a head,
  as FLUX.2's).

`mstar::joint_qk_norm_rotary` is the same for two streams with their own norm weights (FLUX.2's
text and image projections): it reads both and writes their rows in a joint order, so the streams'
queries (or keys) are never concatenated first.

This module imports Triton where it is installed (the kernels' source is qk_norm_rotary_triton);
the models import it only when they use the kernel, so importing mstar never does.
"""

from __future__ import annotations

import torch
from torch.library import wrap_triton

from mstar.engine.kernels import next_power_of_2

try:  # the op's CPU definition needs no Triton; triton_kernels_usable keeps CUDA from needing it
    from mstar.engine.kernels.qk_norm_rotary_triton import qk_norm_rotary_kernel
except ImportError:
    qk_norm_rotary_kernel = None

NORM_SCOPES = ("row", "head", "head_fp32")


def _normed(x: torch.Tensor, weight: torch.Tensor, eps: float, norm_scope: str) -> torch.Tensor:
    """x [T, H, D] RMS-normed with `weight` as norm_scope says, in x's dtype."""
    upcast = x.float()
    if norm_scope == "row":
        variance = upcast.flatten(1).pow(2).mean(-1)[:, None, None]  # [T, 1, 1]
        return (upcast * torch.rsqrt(variance + eps) * weight.float().view(x.shape[1], -1)).to(x.dtype)
    variance = upcast.pow(2).mean(-1, keepdim=True)  # [T, H, 1]
    if norm_scope == "head_fp32":
        return (upcast * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)
    return (upcast * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _rotated(normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    first, second = normed.float().chunk(2, dim=-1)  # [T, H, D/2] each
    if cos.dim() == 2:  # [T, D/2]: one table for every head
        cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(dtype)


def qk_norm_rotary_reference(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm_scope: str
) -> torch.Tensor:
    """The PyTorch definition. x [T, H, D] (halves order); weight [H*D] ("row") or [D] (per head);
    cos/sin fp32 [T, D/2] (every head alike) or [T, H, D/2] (each head its own). Returns x's dtype
    [T, H, D]."""
    return _rotated(_normed(x, weight, eps, norm_scope), cos, sin, x.dtype)


def joint_qk_norm_rotary_reference(
    first, second, first_weight, second_weight, cos, sin, joint_rows, eps: float, norm_scope: str
) -> torch.Tensor:
    """first [Ta, H, D], second [Tb, H, D], each normed with its own weight; row t of the output is
    row joint_rows[t] of the two one after the other (row t without joint_rows), then rotated with
    cos/sin [Ta + Tb, D/2] (the output's order). Returns [Ta + Tb, H, D]."""
    normed = torch.cat(
        [_normed(first, first_weight, eps, norm_scope), _normed(second, second_weight, eps, norm_scope)]
    )
    return _rotated(normed if joint_rows is None else normed[joint_rows], cos, sin, first.dtype)


def _check(x: torch.Tensor, weight: torch.Tensor, norm_scope: str, name: str = "x") -> None:
    if norm_scope not in NORM_SCOPES:
        raise ValueError(f"norm_scope must be one of {NORM_SCOPES}, got {norm_scope!r}")
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"{name} must be [T, H, D] with D even, got {tuple(x.shape)}")
    _, num_heads, head_dim = x.shape
    expected = num_heads * head_dim if norm_scope == "row" else head_dim
    if weight.numel() != expected:
        raise ValueError(
            f"{name}'s weight must have {expected} elements for norm_scope={norm_scope!r}, got {weight.numel()}"
        )


def _check_table(cos: torch.Tensor, num_tokens: int, num_heads: int, head_dim: int) -> None:
    shared, per_head = (num_tokens, head_dim // 2), (num_tokens, num_heads, head_dim // 2)
    if tuple(cos.shape) not in (shared, per_head):
        raise ValueError(
            f"cos/sin must be [T, D/2] = {shared} or [T, H, D/2] = {per_head}, got {tuple(cos.shape)}"
        )


def _rows_of_heads(x: torch.Tensor) -> torch.Tensor:
    """x with each row's heads back to back (as the kernel reads them); any row stride."""
    return x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()


def _launch(x, weight, cos, sin, eps, norm_scope, num_tokens, second=None, second_weight=None, rows=None):
    _, num_heads, head_dim = x.shape
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty((num_tokens, num_heads, head_dim), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    two_sources = second is not None
    wrap_triton(qk_norm_rotary_kernel)[(num_tokens,)](
        x, weight.contiguous(), cos, sin, out, x.stride(0),
        second if two_sources else x, (second_weight if two_sources else weight).contiguous(),
        second.stride(0) if two_sources else 0, x if rows is None else rows, x.shape[0],
        EPS=eps, NUM_HEADS=num_heads, HEADS_BLOCK=next_power_of_2(num_heads), HALF_DIM=head_dim // 2,
        PER_HEAD=norm_scope != "row", ROUND_NORMED=norm_scope == "head", TWO_SOURCES=two_sources,
        GATHER=rows is not None, HEAD_TABLES=cos.dim() == 3, num_warps=4,
    )  # fmt: skip
    return out


def run_triton(x, weight, cos, sin, eps: float, norm_scope: str) -> torch.Tensor:
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1).
    Traceable: inside the op under torch.compile, wrap_triton hands the launch to inductor."""
    return _launch(_rows_of_heads(x), weight, cos, sin, eps, norm_scope, x.shape[0])


def run_triton_joint(first, second, first_weight, second_weight, cos, sin, joint_rows, eps, norm_scope):
    """The joint op's kernel (see run_triton)."""
    rows = None if joint_rows is None else joint_rows.contiguous()
    first, second = _rows_of_heads(first), _rows_of_heads(second)
    num_tokens = first.shape[0] + second.shape[0]
    return _launch(first, first_weight, cos, sin, eps, norm_scope, num_tokens, second, second_weight, rows)


# After run_triton: the op names its kernel (for compiled graphs' cache keys) as it is defined.
@torch.library.triton_op("mstar::qk_norm_rotary", mutates_args=())
def qk_norm_rotary(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm_scope: str
) -> torch.Tensor:
    """A triton_op, so torch.compile sees the kernel and launches it from the compiled graph (a
    custom op's Python dispatch and Triton's launcher cost about 0.2 ms of host time per call).
    On the CPU the op is its PyTorch definition."""
    _check(x, weight, norm_scope)
    _check_table(cos, x.shape[0], x.shape[1], x.shape[-1])
    if x.device.type != "cuda":
        return qk_norm_rotary_reference(x, weight, cos, sin, eps, norm_scope).contiguous()
    return run_triton(x, weight, cos, sin, eps, norm_scope)


@torch.library.triton_op("mstar::joint_qk_norm_rotary", mutates_args=())
def joint_qk_norm_rotary(
    first: torch.Tensor,
    second: torch.Tensor,
    first_weight: torch.Tensor,
    second_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    joint_rows: torch.Tensor | None,
    eps: float,
    norm_scope: str,
) -> torch.Tensor:
    """Two streams' queries (or keys) normed, rotated and written in the joint order in one pass
    (joint_qk_norm_rotary_reference says what). On the CPU the op is its PyTorch definition."""
    _check(first, first_weight, norm_scope, "first")
    _check(second, second_weight, norm_scope, "second")
    if first.shape[1:] != second.shape[1:] or first.dtype != second.dtype:
        raise ValueError(
            f"first and second must share [H, D] and dtype, got {tuple(first.shape)} {first.dtype} "
            f"and {tuple(second.shape)} {second.dtype}"
        )
    num_tokens = first.shape[0] + second.shape[0]
    _check_table(cos, num_tokens, first.shape[1], first.shape[-1])
    if joint_rows is not None and tuple(joint_rows.shape) != (num_tokens,):
        raise ValueError(f"joint_rows must be [Ta + Tb] = [{num_tokens}], got {tuple(joint_rows.shape)}")
    if first.device.type != "cuda":
        return joint_qk_norm_rotary_reference(
            first, second, first_weight, second_weight, cos, sin, joint_rows, eps, norm_scope
        ).contiguous()
    return run_triton_joint(first, second, first_weight, second_weight, cos, sin, joint_rows, eps, norm_scope)
