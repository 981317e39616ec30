"""The Triton source of `mstar::qk_norm_rotary` and `mstar::joint_qk_norm_rotary`
(mstar.engine.kernels.qk_norm_rotary says what they compute). Importing this module imports Triton;
the ops' module does so only where it is installed."""

import triton
import triton.language as tl


@triton.jit
def qk_norm_rotary_kernel(
    x_ptr, weight_ptr, cos_ptr, sin_ptr, out_ptr, x_row_stride,
    second_ptr, second_weight_ptr, second_row_stride, rows_ptr, num_first,
    EPS: tl.constexpr, NUM_HEADS: tl.constexpr, HEADS_BLOCK: tl.constexpr, HALF_DIM: tl.constexpr,
    PER_HEAD: tl.constexpr, ROUND_NORMED: tl.constexpr, TWO_SOURCES: tl.constexpr, GATHER: tl.constexpr,
    HEAD_TABLES: tl.constexpr,
):  # fmt: skip
    # Output row `token` is source row `source` (rows[token] with GATHER) of x, or with TWO_SOURCES
    # of x and then second, one after the other; each source has its own norm weight.
    token = tl.program_id(0).to(tl.int64)
    source = token
    if GATHER:
        source = tl.load(rows_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_BLOCK)[:, None]  # [HB, 1]
    cols = tl.arange(0, HALF_DIM)[None, :]  # [1, D/2]
    mask = heads < NUM_HEADS
    first_offsets = heads * (2 * HALF_DIM) + cols  # [HB, D/2]: each head's first half
    if TWO_SOURCES:
        in_first = (heads * 0 + source) < num_first  # [HB, 1], as a block (masks combine as blocks)
        row = x_ptr + source * x_row_stride
        second_row = second_ptr + (source - num_first) * second_row_stride
        first_mask, second_mask = mask & in_first, mask & (in_first == 0)
        first = tl.load(row + first_offsets, mask=first_mask, other=0.0).to(tl.float32)
        first += tl.load(second_row + first_offsets, mask=second_mask, other=0.0).to(tl.float32)
        second = tl.load(row + first_offsets + HALF_DIM, mask=first_mask, other=0.0).to(tl.float32)
        second += tl.load(second_row + first_offsets + HALF_DIM, mask=second_mask, other=0.0).to(tl.float32)
    else:
        row = x_ptr + source * x_row_stride
        first = tl.load(row + first_offsets, mask=mask, other=0.0).to(tl.float32)
        second = tl.load(row + first_offsets + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
    squares = first * first + second * second  # [HB, D/2]
    if PER_HEAD:
        variance = tl.sum(squares, axis=1)[:, None] / (2 * HALF_DIM)  # [HB, 1]
        scale = 1.0 / tl.sqrt_rn(variance + EPS)
        weight_first = tl.load(weight_ptr + cols).to(tl.float32)
        weight_second = tl.load(weight_ptr + cols + HALF_DIM).to(tl.float32)
        if TWO_SOURCES:
            weight_first = tl.where(in_first, weight_first, tl.load(second_weight_ptr + cols).to(tl.float32))
            weight_second = tl.where(
                in_first, weight_second, tl.load(second_weight_ptr + cols + HALF_DIM).to(tl.float32)
            )
        if ROUND_NORMED:  # Z-Image's order of roundings: the normed value, then its product with the weight
            first = (first * scale).to(out_ptr.dtype.element_ty).to(tl.float32) * weight_first
            second = (second * scale).to(out_ptr.dtype.element_ty).to(tl.float32) * weight_second
        else:  # torch's RMSNorm: float32 throughout, one rounding
            first = first * scale * weight_first
            second = second * scale * weight_second
    else:
        variance = tl.sum(tl.sum(squares, axis=1), axis=0) / (NUM_HEADS * 2 * HALF_DIM)
        scale = 1.0 / tl.sqrt_rn(variance + EPS)
        weight_first = tl.load(weight_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32)
        weight_second = tl.load(weight_ptr + first_offsets + HALF_DIM, mask=mask, other=0.0).to(tl.float32)
        if TWO_SOURCES:
            weight_first = tl.where(
                in_first, weight_first,
                tl.load(second_weight_ptr + first_offsets, mask=mask, other=0.0).to(tl.float32),
            )  # fmt: skip
            weight_second = tl.where(
                in_first, weight_second,
                tl.load(second_weight_ptr + first_offsets + HALF_DIM, mask=mask, other=0.0).to(tl.float32),
            )  # fmt: skip
        first = first * scale * weight_first
        second = second * scale * weight_second
    first = first.to(out_ptr.dtype.element_ty).to(tl.float32)
    second = second.to(out_ptr.dtype.element_ty).to(tl.float32)
    if HEAD_TABLES:  # cos/sin [T, H, D/2]: each head its own frequencies
        table_offsets = token * (NUM_HEADS * HALF_DIM) + heads * HALF_DIM + cols  # [HB, D/2]
        cos = tl.load(cos_ptr + table_offsets, mask=mask, other=0.0)
        sin = tl.load(sin_ptr + table_offsets, mask=mask, other=0.0)
    else:  # cos/sin [T, D/2], shared by every head
        cos = tl.load(cos_ptr + token * HALF_DIM + cols)  # [1, D/2]
        sin = tl.load(sin_ptr + token * HALF_DIM + cols)
    out = out_ptr + token * (NUM_HEADS * 2 * HALF_DIM)
    tl.store(out + first_offsets, (first * cos - second * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(
        out + first_offsets + HALF_DIM,
        (first * sin + second * cos).to(out_ptr.dtype.element_ty),
        mask=mask,
    )
