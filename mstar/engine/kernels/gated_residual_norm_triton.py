"""The Triton source of `mstar::gated_residual_rms_norm` (mstar.engine.kernels.gated_residual_norm
says what it computes). Importing this module imports Triton; the op's module does so only where it is
installed."""

import triton
import triton.language as tl


@triton.jit
def gated_residual_rms_norm_kernel(
    x_ptr, y_ptr, gate_ptr, y_weight_ptr, x_weight_ptr, scale_ptr, token_item_ptr, x_out_ptr, h_out_ptr,
    gate_row_stride, scale_row_stride,
    EPS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr, HAS_NEXT: tl.constexpr, GATHER: tl.constexpr,
):  # fmt: skip
    dtype = x_out_ptr.dtype.element_ty
    token = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    item = 0
    if GATHER:
        item = tl.load(token_item_ptr + token).to(tl.int64)
    # Z-Image's RMSNorm: fp32 statistics, the normed value rounded, times the weight, rounded
    y = tl.load(y_ptr + token * DIM + cols, mask=mask, other=0.0).to(tl.float32)
    y_scale = 1.0 / tl.sqrt_rn(tl.sum(y * y, axis=0) / DIM + EPS)
    y_weight = tl.load(y_weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed_y = ((y * y_scale).to(dtype).to(tl.float32) * y_weight).to(dtype).to(tl.float32)
    gate = tl.load(gate_ptr + item * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + token * DIM + cols, mask=mask, other=0.0).to(tl.float32)
    x_new = (x + (gate * normed_y).to(dtype).to(tl.float32)).to(dtype)
    tl.store(x_out_ptr + token * DIM + cols, x_new, mask=mask)
    if HAS_NEXT:
        x_row = x_new.to(tl.float32)
        x_scale = 1.0 / tl.sqrt_rn(tl.sum(x_row * x_row, axis=0) / DIM + EPS)
        x_weight = tl.load(x_weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        normed_x = ((x_row * x_scale).to(dtype).to(tl.float32) * x_weight).to(dtype).to(tl.float32)
        scale = tl.load(scale_ptr + item * scale_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(h_out_ptr + token * DIM + cols, (normed_x * scale).to(dtype), mask=mask)
