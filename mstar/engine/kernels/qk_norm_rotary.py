"""`mstar::qk_norm_rotary`: a DiT's query/key RMS norm and rotary embedding as one Triton kernel.

Inductor fuses the norm and the rotation of each head but re-reads every row to pair a head's two
halves: on the H200 the fused kernel ran at about a quarter of memory speed (Wan 480p guidance pair:
195 us per layer; Z-Image 1024: 79 us). Here one program holds a token's whole row in registers as
[heads, 2, D/2] halves, reduces it, scales it and rotates it, reading and writing each element once.

Layout: each head's rotary pairs stored as halves (mstar.models.rotary.halves_order). The norm runs
over the whole row (Wan: RMSNorm over all heads) or over each head (Z-Image), with the roundings of
the models' PyTorch code, which stays the reference (`qk_norm_rotary_reference`, and the CPU impl).
Triton is imported when a CUDA call first needs the kernel, never at import.
"""

from __future__ import annotations

import functools

import torch

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


@torch.library.custom_op("mstar::qk_norm_rotary", mutates_args=())
def qk_norm_rotary(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, norm_scope: str
) -> torch.Tensor:
    _check(x, weight, cos, norm_scope)
    return qk_norm_rotary_reference(x, weight, cos, sin, eps, norm_scope)


@qk_norm_rotary.register_fake
def _qk_norm_rotary_fake(x, weight, cos, sin, eps, norm_scope):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous [T, H, D]


@qk_norm_rotary.register_kernel("cuda")
def _qk_norm_rotary_cuda(x, weight, cos, sin, eps, norm_scope):
    _check(x, weight, cos, norm_scope)
    return run_triton(x, weight, cos, sin, eps, norm_scope)


def run_triton(x, weight, cos, sin, eps: float, norm_scope: str) -> torch.Tensor:
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1)."""
    import triton

    num_tokens, num_heads, head_dim = x.shape
    if x.stride(-1) != 1 or x.stride(-2) != head_dim:
        x = x.contiguous()  # the kernel reads each row's heads back to back
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    _kernel()[(num_tokens,)](
        x, weight.contiguous(), cos, sin, out, x.stride(0), eps,
        NUM_HEADS=num_heads, HEADS_BLOCK=triton.next_power_of_2(num_heads), HALF_DIM=head_dim // 2,
        PER_HEAD=norm_scope == "head", num_warps=4,
    )  # fmt: skip
    return out


@functools.cache
def _kernel():
    """The jitted kernel, built on first use (imports Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def qk_norm_rotary_kernel(
        x_ptr, weight_ptr, cos_ptr, sin_ptr, out_ptr, x_row_stride, eps,
        NUM_HEADS: tl.constexpr, HEADS_BLOCK: tl.constexpr, HALF_DIM: tl.constexpr, PER_HEAD: tl.constexpr,
    ):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)
        heads = tl.arange(0, HEADS_BLOCK)[:, None]  # [HB, 1]
        cols = tl.arange(0, HALF_DIM)[None, :]  # [1, D/2]
        mask = heads < NUM_HEADS
        first_offsets = heads * (2 * HALF_DIM) + cols  # [HB, D/2]: each head's first half
        row = x_ptr + token * x_row_stride
        first = tl.load(row + first_offsets, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(row + first_offsets + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
        squares = first * first + second * second  # [HB, D/2]
        if PER_HEAD:
            variance = tl.sum(squares, axis=1)[:, None] / (2 * HALF_DIM)  # [HB, 1]
            scale = 1.0 / tl.sqrt_rn(variance + eps)
            weight_first = tl.load(weight_ptr + cols).to(tl.float32)
            weight_second = tl.load(weight_ptr + cols + HALF_DIM).to(tl.float32)
            # Z-Image's order of roundings: the normed value, then its product with the weight
            first = (first * scale).to(out_ptr.dtype.element_ty).to(tl.float32) * weight_first
            second = (second * scale).to(out_ptr.dtype.element_ty).to(tl.float32) * weight_second
        else:
            variance = tl.sum(tl.sum(squares, axis=1), axis=0) / (NUM_HEADS * 2 * HALF_DIM)
            scale = 1.0 / tl.sqrt_rn(variance + eps)
            weight_first = tl.load(weight_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
            weight_second = tl.load(weight_ptr + first_offsets + HALF_DIM, mask=mask, other=0.0).to(
                tl.float32
            )
            first = first * scale * weight_first
            second = second * scale * weight_second
        first = first.to(out_ptr.dtype.element_ty).to(tl.float32)
        second = second.to(out_ptr.dtype.element_ty).to(tl.float32)
        cos = tl.load(cos_ptr + token * HALF_DIM + cols)  # [1, D/2]
        sin = tl.load(sin_ptr + token * HALF_DIM + cols)
        out = out_ptr + token * (NUM_HEADS * 2 * HALF_DIM)
        tl.store(out + first_offsets, (first * cos - second * sin).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(
            out + first_offsets + HALF_DIM,
            (first * sin + second * cos).to(out_ptr.dtype.element_ty),
            mask=mask,
        )

    return qk_norm_rotary_kernel
