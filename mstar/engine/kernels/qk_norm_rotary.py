"""`mstar::qk_norm_rotary`: a DiT's query/key RMS norm and rotary embedding as one Triton kernel.

Inductor fuses the norm and the rotation of each head but re-reads every row to pair a head's two
halves: on the H200 the fused kernel ran at about a quarter of memory speed (Wan 480p guidance pair:
195 us per layer; Z-Image 1024: 79 us). Here one program holds a token's whole row in registers as
[heads, 2, D/2] halves, reduces it, scales it and rotates it, reading and writing each element once.

Layout: each head's rotary pairs stored as halves (mstar.models.rotary.halves_order). The norm runs
over the whole row (Wan: RMSNorm over all heads) or over each head (Z-Image), with the roundings of
the models' PyTorch code, which stays the reference (`qk_norm_rotary_reference`, and the CPU impl).
This module imports Triton where it is installed (the kernel's source is qk_norm_rotary_triton);
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

NORM_SCOPES = ("row", "head")


def qk_norm_rotary_reference(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm_scope: str
) -> torch.Tensor:
    """The PyTorch definition. x [T, H, D] (halves order); weight [H*D] ("row") or [D] ("head");
    cos/sin fp32 [T, D/2]. Returns x's dtype [T, H, D].

    "row" rounds once after norm and weight (torch's fused RMSNorm: fp32 throughout, as Wan's
    nn.RMSNorm); "head" rounds the normed value, then its product with the weight (Z-Image's RMSNorm)."""
    upcast = x.float()
    if norm_scope == "row":
        variance = upcast.flatten(1).pow(2).mean(-1)[:, None, None]  # [T, 1, 1]
        normed = (upcast * torch.rsqrt(variance + eps) * weight.float().view(x.shape[1], -1)).to(x.dtype)
    else:
        variance = upcast.pow(2).mean(-1, keepdim=True)  # [T, H, 1]
        normed = (upcast * torch.rsqrt(variance + eps)).to(x.dtype) * weight
    first, second = normed.float().chunk(2, dim=-1)  # [T, H, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def _check(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, norm_scope: str) -> None:
    if norm_scope not in NORM_SCOPES:
        raise ValueError(f"norm_scope must be one of {NORM_SCOPES}, got {norm_scope!r}")
    if x.dim() != 3 or x.shape[-1] % 2:
        raise ValueError(f"x must be [T, H, D] with D even, got {tuple(x.shape)}")
    num_tokens, num_heads, head_dim = x.shape
    expected = num_heads * head_dim if norm_scope == "row" else head_dim
    if weight.numel() != expected:
        raise ValueError(
            f"weight must have {expected} elements for norm_scope={norm_scope!r}, got {weight.numel()}"
        )
    if tuple(cos.shape) != (num_tokens, head_dim // 2):
        raise ValueError(f"cos/sin must be [T, D/2] = {(num_tokens, head_dim // 2)}, got {tuple(cos.shape)}")


def run_triton(x, weight, cos, sin, eps: float, norm_scope: str) -> torch.Tensor:
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1).
    Traceable: inside the op under torch.compile, wrap_triton hands the launch to inductor."""
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(-1) != 1 or x.stride(-2) != head_dim:
        x = x.contiguous()  # the kernel reads each row's heads back to back
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    wrap_triton(qk_norm_rotary_kernel)[(num_tokens,)](
        x, weight.contiguous(), cos, sin, out, x.stride(0),
        EPS=eps, NUM_HEADS=num_heads, HEADS_BLOCK=next_power_of_2(num_heads), HALF_DIM=head_dim // 2,
        PER_HEAD=norm_scope == "head", num_warps=4,
    )  # fmt: skip
    return out


# After run_triton: the op names its kernel (for compiled graphs' cache keys) as it is defined.
@torch.library.triton_op("mstar::qk_norm_rotary", mutates_args=())
def qk_norm_rotary(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm_scope: str
) -> torch.Tensor:
    """A triton_op, so torch.compile sees the kernel and launches it from the compiled graph (a
    custom op's Python dispatch and Triton's launcher cost about 0.2 ms of host time per call).
    On the CPU the op is its PyTorch definition."""
    _check(x, weight, cos, norm_scope)
    if x.device.type != "cuda":
        return qk_norm_rotary_reference(x, weight, cos, sin, eps, norm_scope).contiguous()
    return run_triton(x, weight, cos, sin, eps, norm_scope)
