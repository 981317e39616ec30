"""The Triton source of `mstar::lora_activation` (mstar.engine.kernels.lora_activation says what it
computes). Importing this module imports Triton; the op's module does so only where it is installed."""

import triton
import triton.language as tl


@triton.jit
def lora_activation_kernel(
    y_ptr, hidden_ptr, b_ptr, ends_ptr, out_ptr,
    num_rows, num_segments, block_width, width, y_row_stride, hidden_row_stride,
    SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M rows x BLOCK_N output columns, the column tiles of one row tile adjacent
    # (they share the rows' shrink output in L2). Slice j of y is columns [j*width, (j+1)*width).
    pid = tl.program_id(0)
    num_col_tiles = tl.cdiv(width, BLOCK_N)
    first_row = (pid // num_col_tiles) * BLOCK_M
    rows = first_row + tl.arange(0, BLOCK_M)  # [BM]
    cols = (pid % num_col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    row_in, col_in = rows < num_rows, cols < width
    rows64 = rows.to(tl.int64)
    # the accumulators start as the base output (loaded before the expand, so its latency hides
    # behind the dots): slice 0 (the only one for GELU), and slice 1, the up projection (SwiGLU)
    mask = row_in[:, None] & col_in[None, :]
    y_offsets = rows64[:, None] * y_row_stride + cols[None, :]
    gate = tl.load(y_ptr + y_offsets, mask=mask, other=0.0).to(tl.float32)  # [BM, BN]
    up = gate
    if SWIGLU:
        up = tl.load(y_ptr + y_offsets + width, mask=mask, other=0.0).to(tl.float32)
    last_row = tl.minimum(first_row + BLOCK_M, num_rows)
    num_slices = 2 if SWIGLU else 1
    # while loops, not range(): Triton's interpreter cannot take a runtime int as a range bound
    segment = 0
    while segment < num_segments:
        start = tl.load(ends_ptr + segment - 1, mask=segment > 0, other=0)
        end = tl.load(ends_ptr + segment)
        # a tile may straddle segments: each one overlapping it adds its rows' update, the other
        # rows' shrink outputs loaded as zeros
        if (start < last_row) & (end > first_row) & (end > start):
            in_segment = row_in & (rows >= start) & (rows < end)
            b_row0 = (segment * num_slices).to(tl.int64) * block_width
            k = 0
            while k < block_width:
                ks = k + tl.arange(0, BLOCK_K)  # [BK]
                k_in = ks < block_width
                h_offsets = rows64[:, None] * hidden_row_stride + ks[None, :]
                h_mask = in_segment[:, None] & k_in[None, :]
                b_offsets = (b_row0 + ks)[:, None] * width + cols[None, :]
                b_mask = k_in[:, None] & col_in[None, :]
                # input_precision: float32 multiplies exactly (no tf32); bf16 takes the tensor cores
                h = tl.load(hidden_ptr + h_offsets, mask=h_mask, other=0.0)  # [BM, BK]
                b = tl.load(b_ptr + b_offsets, mask=b_mask, other=0.0)  # [BK, BN]
                gate = tl.dot(h, b, gate, input_precision="ieee")
                if SWIGLU:
                    h = tl.load(hidden_ptr + h_offsets + block_width, mask=h_mask, other=0.0)
                    b = tl.load(b_ptr + b_offsets + block_width * width, mask=b_mask, other=0.0)
                    up = tl.dot(h, b, up, input_precision="ieee")
                k += BLOCK_K
        segment += 1
    if SWIGLU:
        out = gate * tl.sigmoid(gate) * up
    else:  # GELU, tanh approximation: 0.5 * (1 + tanh(a)) = sigmoid(2a)
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        out = gate * tl.sigmoid(2.0 * inner)
    out_offsets = rows64[:, None] * width + cols[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=mask)
