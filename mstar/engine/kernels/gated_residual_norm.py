"""`mstar::gated_residual_rms_norm`: a modulated DiT block's residual update and the next norm, one
Triton kernel.

Between the GEMMs of a Z-Image block, each token's row goes through

    x_new = x + gate[item] * rms_norm(y, y_weight)           (y: attention or FFN output)
    h     = rms_norm(x_new, x_weight) * scale[item]           (the next GEMM's input)

Inductor fuses this into one persistent reduction but, for rows of 3840, ran it at about 40% of
memory speed on the H200 (64 us per call at 1024x1024, two calls per layer). Here one program
holds a token's row in registers and reads x and y once, writes x_new and h once.

`rms_norm` is Z-Image's: statistics in fp32, the normed value rounded to the row's dtype, then
multiplied by the weight and rounded again; every product and sum rounds to the row's dtype as
the PyTorch code does (`gated_residual_rms_norm_reference`, also the CPU impl). gate and scale are
per-item rows [num_items, dim] (tanh and 1 + scale already applied), gathered by `token_item`
[T] when there is more than one. Without x_weight (the last block) only x_new is computed.
"""

from __future__ import annotations

import torch
from torch.library import wrap_triton

from mstar.engine.kernels import next_power_of_2

try:  # the op's CPU definition needs no Triton; triton_kernels_usable keeps CUDA from needing it
    from mstar.engine.kernels.gated_residual_norm_triton import gated_residual_rms_norm_kernel
except ImportError:
    gated_residual_rms_norm_kernel = None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Z-Image's RMSNorm (mstar.models.zimage.dit_layers.RMSNorm), as a function."""
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    normed = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        normed = normed.to(weight.dtype)
    return normed * weight


def _per_token(rows: torch.Tensor, token_item: torch.Tensor) -> torch.Tensor:
    return rows if rows.shape[0] == 1 else rows[token_item]


def gated_residual_rms_norm_reference(
    x, y, gate_rows, y_weight, x_weight, scale_rows, token_item, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [T, dim]; gate_rows, scale_rows [num_items, dim]; token_item [T]. Returns (x_new, h);
    h is empty [0, dim] without x_weight."""
    x_new = x + _per_token(gate_rows, token_item) * _rms_norm(y, y_weight, eps)
    if x_weight is None:
        return x_new, x_new.new_empty((0, x.shape[1]))
    return x_new, _rms_norm(x_new, x_weight, eps) * _per_token(scale_rows, token_item)


def _check(x, y, gate_rows, y_weight, x_weight, scale_rows, token_item) -> None:
    if x.dim() != 2 or y.shape != x.shape:
        raise ValueError(f"x and y must both be [T, dim], got {tuple(x.shape)} and {tuple(y.shape)}")
    dim = x.shape[1]
    if gate_rows.dim() != 2 or gate_rows.shape[1] != dim:
        raise ValueError(f"gate_rows must be [num_items, {dim}], got {tuple(gate_rows.shape)}")
    if (x_weight is None) != (scale_rows is None):
        raise ValueError("x_weight and scale_rows come together (the next norm) or not at all")
    if scale_rows is not None and tuple(scale_rows.shape) != tuple(gate_rows.shape):
        raise ValueError(
            f"scale_rows must be shaped as gate_rows {tuple(gate_rows.shape)}, got {tuple(scale_rows.shape)}"
        )
    for name, weight in (("y_weight", y_weight), ("x_weight", x_weight)):
        if weight is not None and weight.numel() != dim:
            raise ValueError(f"{name} must have {dim} elements, got {weight.numel()}")
    if gate_rows.shape[0] > 1 and token_item.shape != (x.shape[0],):
        raise ValueError(f"token_item must be [T] = [{x.shape[0]}], got {tuple(token_item.shape)}")


def run_triton(x, y, gate_rows, y_weight, x_weight, scale_rows, token_item, eps: float):
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1)."""
    num_tokens, dim = x.shape
    x, y = x.contiguous(), y.contiguous()
    has_next = x_weight is not None
    x_new = torch.empty_like(x)
    h = torch.empty_like(x) if has_next else x.new_empty((0, dim))
    if num_tokens == 0:
        return x_new, h
    if gate_rows.stride(1) != 1 or (has_next and scale_rows.stride(1) != 1):
        gate_rows = gate_rows.contiguous()
        scale_rows = scale_rows.contiguous() if has_next else None
    wrap_triton(gated_residual_rms_norm_kernel)[(num_tokens,)](
        x, y, gate_rows, y_weight, x_weight if has_next else y_weight, scale_rows if has_next else gate_rows,
        token_item, x_new, h, gate_rows.stride(0),
        scale_rows.stride(0) if has_next else 0,
        EPS=eps, DIM=dim, BLOCK=next_power_of_2(dim), HAS_NEXT=has_next, GATHER=gate_rows.shape[0] > 1,
        num_warps=8,
    )  # fmt: skip
    return x_new, h


# After run_triton: the op names its kernel (for compiled graphs' cache keys) as it is defined.
@torch.library.triton_op("mstar::gated_residual_rms_norm", mutates_args=())
def gated_residual_rms_norm(
    x: torch.Tensor,
    y: torch.Tensor,
    gate_rows: torch.Tensor,
    y_weight: torch.Tensor,
    x_weight: torch.Tensor | None,
    scale_rows: torch.Tensor | None,
    token_item: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A triton_op, so torch.compile launches the kernel from the compiled graph (see
    mstar.engine.kernels.qk_norm_rotary). On the CPU the op is its PyTorch definition."""
    _check(x, y, gate_rows, y_weight, x_weight, scale_rows, token_item)
    if x.device.type != "cuda":
        x_new, h = gated_residual_rms_norm_reference(
            x, y, gate_rows, y_weight, x_weight, scale_rows, token_item, eps
        )
        return x_new.contiguous(), h.contiguous()
    return run_triton(x, y, gate_rows, y_weight, x_weight, scale_rows, token_item, eps)
