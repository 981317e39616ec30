"""`mstar::lora_activation`: a LoRA-wrapped FFN Linear's per-segment expand applied inside the
activation after it, one Triton kernel, so no [T, out] delta is ever written or read.

In a packed step with adapters, the FFN's first Linear on the grouped path costs, beyond the base
GEMM, the expand's write of a delta as wide as its output and the consumer's read of it (4 bytes a
row per output column in bf16); for Wan's FFN in (3072 -> 14336) and Z-Image's w1/w3 (3840 ->
2 x 10240) that is most of their LoRA cost. Here one program takes a tile of the base output and
adds each overlapping segment's h_seg @ B_seg on tensor cores before the activation:

    out = act(y + delta)       delta[t] = hidden[t, block j] @ b_seg[segment(t), j]   per slice j
    "gelu_tanh": y [T, N], out = gelu(y + delta_0, tanh approximation)            (Wan's FFN)
    "swiglu":    y [T, 2N] (gate | up), out = silu(g + delta_0) * (u + delta_1)   (Z-Image's w13)

y is the base GEMM's output (bias included); hidden [T, J*KR] the shrink's output, slice j's K*R
columns (K adapters of rank R side by side) in block j; b_seg [S, J, KR, N] each segment's B for
slice j, already scaled; ends int32 [S] the segments' cumulative end rows. The sum, the
activation and its product run in float32 and round once to y's dtype.
`lora_activation_reference` (the CPU impl too) reads no values on the host, so it traces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.library import wrap_triton

try:  # the op's CPU definition needs no Triton; triton_kernels_usable keeps CUDA from needing it
    from mstar.engine.kernels.lora_activation_triton import lora_activation_kernel
except ImportError:
    lora_activation_kernel = None

ACTIVATIONS = {"gelu_tanh": 1, "swiglu": 2}  # activation -> slices of y it reads
# (BLOCK_M, BLOCK_N, num_warps) per activation, the fastest of `python -m mstar.bench.lora_activation`
# on the H200 (Wan's FFN-in, 24,960 rows, 515 us against 1,053 for (128, 128, 8); Z-Image's w13,
# 16,896 rows, 423 us against 494 for (128, 64, 8)); BLOCK_K splits the shrink's K*R columns
TILES = {"gelu_tanh": (64, 128, 4), "swiglu": (64, 64, 4)}
BLOCK_K = 32


def lora_activation_reference(
    y: torch.Tensor, hidden: torch.Tensor, b_seg: torch.Tensor, ends: torch.Tensor, activation: str
) -> torch.Tensor:
    """The definition. Each row's update is its hidden block against its segment's B: the row's
    block placed in its segment's columns of a [T, S*KR] matrix (zeros elsewhere) times every
    segment's B stacked, so no segment boundary is read on the host."""
    num_segments, num_slices, block, width = b_seg.shape
    compute = torch.promote_types(y.dtype, torch.float32)
    rows = torch.arange(y.shape[0], device=y.device, dtype=ends.dtype)
    segment = torch.bucketize(rows, ends, right=True)  # [T]; S for rows past the last end
    own = (segment[:, None] == torch.arange(num_segments, device=y.device)).to(compute)  # [T, S]
    z = y.to(compute).clone()
    for index in range(num_slices):
        h = hidden[:, index * block : (index + 1) * block].to(compute)  # [T, KR]
        placed = (own[:, :, None] * h[:, None, :]).reshape(y.shape[0], num_segments * block)
        delta = placed @ b_seg[:, index].to(compute).reshape(num_segments * block, width)
        z[:, index * width : (index + 1) * width] += delta
    if activation == "gelu_tanh":
        return F.gelu(z, approximate="tanh").to(y.dtype)
    gate, up = z.chunk(2, dim=1)
    return (F.silu(gate) * up).to(y.dtype)


def _check(y, hidden, b_seg, ends, activation) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if b_seg.dim() != 4 or b_seg.shape[1] != ACTIVATIONS[activation]:
        raise ValueError(
            f"b_seg must be [S, {ACTIVATIONS[activation]}, K*R, N] for {activation}, got {tuple(b_seg.shape)}"
        )
    num_segments, num_slices, block, width = b_seg.shape
    if y.dim() != 2 or y.shape[1] != num_slices * width:
        raise ValueError(f"y must be [T, {num_slices * width}], got {tuple(y.shape)}")
    if tuple(hidden.shape) != (y.shape[0], num_slices * block):
        raise ValueError(
            f"hidden must be [T, J*K*R] = {(y.shape[0], num_slices * block)}, got {tuple(hidden.shape)}"
        )
    if ends.dtype != torch.int32 or tuple(ends.shape) != (num_segments,):
        raise ValueError(f"ends must be int32 [S] = [{num_segments}], got {ends.dtype} {tuple(ends.shape)}")
    if len({y.dtype, hidden.dtype, b_seg.dtype}) != 1:
        raise ValueError(
            f"y, hidden and b_seg must share a dtype, got {y.dtype}, {hidden.dtype}, {b_seg.dtype}"
        )


def run_triton(y, hidden, b_seg, ends, activation: str, tiles: tuple[int, int, int] | None = None):
    """The Triton kernel on any device Triton runs on (CUDA; CPU tensors under TRITON_INTERPRET=1);
    `tiles` (BLOCK_M, BLOCK_N, num_warps) overrides TILES (tests: small tiles, many of them)."""
    num_segments, _, block, width = b_seg.shape
    block_m, block_n, num_warps = tiles or TILES[activation]
    num_rows = y.shape[0]
    out = torch.empty((num_rows, width), dtype=y.dtype, device=y.device)
    if num_rows == 0:
        return out
    y = y if y.stride(1) == 1 else y.contiguous()
    hidden = hidden if hidden.stride(1) == 1 else hidden.contiguous()
    num_tiles = ((num_rows + block_m - 1) // block_m) * ((width + block_n - 1) // block_n)
    wrap_triton(lora_activation_kernel)[(num_tiles,)](
        y, hidden, b_seg.contiguous(), ends.contiguous(), out,
        num_rows, num_segments, block, width, y.stride(0), hidden.stride(0),
        SWIGLU=activation == "swiglu", BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K,
        num_warps=num_warps,
    )  # fmt: skip
    return out


# After run_triton: the op names its kernel (for compiled graphs' cache keys) as it is defined.
@torch.library.triton_op("mstar::lora_activation", mutates_args=())
def lora_activation(
    y: torch.Tensor, hidden: torch.Tensor, b_seg: torch.Tensor, ends: torch.Tensor, activation: str
) -> torch.Tensor:
    """A triton_op, so torch.compile launches the kernel from the compiled graph (see
    mstar.engine.kernels.qk_norm_rotary). On the CPU the op is its PyTorch definition."""
    _check(y, hidden, b_seg, ends, activation)
    if y.device.type != "cuda":
        return lora_activation_reference(y, hidden, b_seg, ends, activation).contiguous()
    return run_triton(y, hidden, b_seg, ends, activation)
