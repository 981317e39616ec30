"""`mstar::residual_layer_norm`: a Wan block's residual update and the LayerNorm (with its affine
or its timestep modulation) of the next GEMM's input, one Triton kernel.

Between the GEMMs of a Wan block each token's row goes through

    x_new = x + y * gate[item]          (y: attention or FFN output; gate optional)
    h     = layer_norm(x_new) [* weight + bias] [* scale[item] + shift[item]]

three times a block: self attention's output and the cross-attention norm (affine), cross
attention's output and the FFN's modulated norm, the FFN's output and the next block's (or the
output head's) modulated norm. Inductor fuses each into one reduction at 59-88 us a call on the
H200 (Wan 480p guidance pair, rows of 3072); here one program holds a token's row in registers and
reads x and y once, writes x_new and h once.

The arithmetic is the model's (mstar.models.wan22.dit_layers.WanBlock): the residual in float32,
rounded to the row's dtype; the norm in float32 on the rounded row, the affine and modulation in
float32, one rounding at the end. gate, scale and shift are float32 rows per item [num_items, dim]
(scale with the 1 already added), gathered by `token_item` [T]. Without y (the first block's
input) only h is computed; x_new comes back empty [0, dim]. `residual_layer_norm_reference` is the
definition and the CPU impl. This module imports Triton where it is installed (the kernel's source
is residual_layer_norm_triton); the models import it only when they use the kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.library import wrap_triton

from mstar.engine.kernels import next_power_of_2

try:  # the op's CPU definition needs no Triton; triton_kernels_usable keeps CUDA from needing it
    from mstar.engine.kernels.residual_layer_norm_triton import residual_layer_norm_kernel
except ImportError:
    residual_layer_norm_kernel = None


def residual_layer_norm_reference(
    x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [T, dim]; gate_rows, scale_rows, shift_rows float32 [num_items, dim]; token_item [T].
    Returns (x_new [T, dim], or [0, dim] without y; h [T, dim]), both in x's dtype."""
    if y is None:
        x_new, normed_input = x.new_empty((0, x.shape[1])), x
    elif gate_rows is None:
        x_new = normed_input = x + y
    else:
        x_new = normed_input = (x.float() + y * gate_rows[token_item]).type_as(x)
    affine_weight = None if weight is None else weight.float()
    affine_bias = None if bias is None else bias.float()
    h = F.layer_norm(normed_input.float(), (x.shape[1],), affine_weight, affine_bias, eps)
    if scale_rows is not None:
        h = h * scale_rows[token_item] + shift_rows[token_item]
    return x_new, h.type_as(x)


def _check(x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [T, dim], got {tuple(x.shape)}")
    num_tokens, dim = x.shape
    if y is not None and y.shape != x.shape:
        raise ValueError(f"y must be shaped as x {tuple(x.shape)}, got {tuple(y.shape)}")
    if gate_rows is not None and y is None:
        raise ValueError("gate_rows needs y (the residual's update)")
    if (weight is None) != (bias is None) or (scale_rows is None) != (shift_rows is None):
        raise ValueError("weight and bias come together, and so do scale_rows and shift_rows")
    for name, vector in (("weight", weight), ("bias", bias)):
        if vector is not None and vector.numel() != dim:
            raise ValueError(f"{name} must have {dim} elements, got {vector.numel()}")
    for name, rows in (("gate_rows", gate_rows), ("scale_rows", scale_rows), ("shift_rows", shift_rows)):
        if rows is not None and (rows.dim() != 2 or rows.shape[1] != dim):
            raise ValueError(f"{name} must be [num_items, {dim}], got {tuple(rows.shape)}")
    if token_item.shape != (num_tokens,):
        raise ValueError(f"token_item must be [T] = [{num_tokens}], got {tuple(token_item.shape)}")


def run_triton(x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item, eps: float):
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1)."""
    num_tokens, dim = x.shape
    x = x.contiguous()
    has_residual = y is not None
    x_new = torch.empty_like(x) if has_residual else x.new_empty((0, dim))
    h = torch.empty_like(x)
    if num_tokens == 0:
        return x_new, h

    def rows(tensor):  # absent inputs are never read (their constexpr flag is off): any pointer does
        return x if tensor is None else tensor.contiguous()

    wrap_triton(residual_layer_norm_kernel)[(num_tokens,)](
        x, rows(y), rows(gate_rows), rows(weight), rows(bias), rows(scale_rows), rows(shift_rows),
        token_item, x_new, h,
        EPS=eps, DIM=dim, BLOCK=next_power_of_2(dim), HAS_RESIDUAL=has_residual,
        HAS_GATE=gate_rows is not None, AFFINE=weight is not None, MODULATE=scale_rows is not None,
        num_warps=8,
    )  # fmt: skip
    return x_new, h


# After run_triton: the op names its kernel (for compiled graphs' cache keys) as it is defined.
@torch.library.triton_op("mstar::residual_layer_norm", mutates_args=())
def residual_layer_norm(
    x: torch.Tensor,
    y: torch.Tensor | None,
    gate_rows: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    scale_rows: torch.Tensor | None,
    shift_rows: torch.Tensor | None,
    token_item: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A triton_op, so torch.compile launches the kernel from the compiled graph (see
    mstar.engine.kernels.qk_norm_rotary). On the CPU the op is its PyTorch definition."""
    _check(x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item)
    if x.device.type != "cuda":
        x_new, h = residual_layer_norm_reference(
            x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item, eps
        )
        return x_new.contiguous(), h.contiguous()
    return run_triton(x, y, gate_rows, weight, bias, scale_rows, shift_rows, token_item, eps)
