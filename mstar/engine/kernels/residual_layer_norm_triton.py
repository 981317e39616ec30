"""The Triton source of `mstar::residual_layer_norm` (mstar.engine.kernels.residual_layer_norm says
what it computes). Importing this module imports Triton; the op's module does so only where it is
installed."""

import triton
import triton.language as tl


@triton.jit
def residual_layer_norm_kernel(
    x_ptr, y_ptr, gate_ptr, weight_ptr, bias_ptr, scale_ptr, shift_ptr, token_item_ptr, x_out_ptr, h_out_ptr,
    EPS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_GATE: tl.constexpr, AFFINE: tl.constexpr, MODULATE: tl.constexpr,
):  # fmt: skip
    dtype = h_out_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    item = tl.load(token_item_ptr + token).to(tl.int64)
    x = tl.load(x_ptr + token * DIM + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        y = tl.load(y_ptr + token * DIM + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_GATE:
            y = y * tl.load(gate_ptr + item * DIM + cols, mask=mask, other=0.0).to(tl.float32)
        x_new = (x + y).to(dtype)  # the residual stream rounds to its dtype, as the model's code
        tl.store(x_out_ptr + token * DIM + cols, x_new, mask=mask)
        x = x_new.to(tl.float32)
    # LayerNorm in float32: the mean, then the variance of the centred row (two passes in registers)
    mean = tl.sum(x, axis=0) / DIM
    centred = tl.where(mask, x - mean, 0.0)
    variance = tl.sum(centred * centred, axis=0) / DIM
    h = centred * (1.0 / tl.sqrt_rn(variance + EPS))
    if AFFINE:
        h = h * tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        h = h + tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if MODULATE:
        h = h * tl.load(scale_ptr + item * DIM + cols, mask=mask, other=0.0).to(tl.float32)
        h = h + tl.load(shift_ptr + item * DIM + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(h_out_ptr + token * DIM + cols, h.to(dtype), mask=mask)
