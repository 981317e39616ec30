"""How a wrapped Linear adds its segments' LoRA in a packed step, and the rule that picks the way.

Per Linear: T rows, I in-features, O out-features in J slices (a fused q/k/v has 3), k adapters per
segment (the step's widest), n distinct adapters in the step, R = max_lora_rank, e = 2 bytes (bf16),
beta = the device's FLOPs per byte of memory traffic (H100/H200 bf16 dense: 989 TFLOP/s over
4.8 TB/s, about 200). The base GEMM (2*T*I*O FLOPs) is compute-bound; LoRA's own FLOPs are a few
percent of it, so what a path costs is its passes over [T, *] activations (bytes per row):

- "grouped": shrink x_seg @ A_seg (reads x: e*I), one expand per slice (writes the delta: e*O),
  their cat for J > 1 (a copy: 2*e*O, unless inductor fuses it), y + delta (reads the delta: e*O
  when fused into the consumer, 3*e*O when not).            e*(I + 2*O)  [+ 2*e*O for J > 1]
- "epilogue": the same shrink, ONE expand per segment against the slices' B side by side in a
  block-diagonal [J*k*R, O] (no cat; its J-1 zero blocks cost 2*(J-1)*k*R*O FLOPs), the result
  is the C of the base GEMM (addmm: read once in the GEMM's epilogue; the bias rides in the expand
  as a ones column of the shrink output).                   e*(I + 2*O) + 2*(J-1)*k*R*O/beta
- "concat": y = [x | H] @ [W ; B_step]^T, ONE GEMM with K = I + J*n*R; H [T, J*n*R] holds each
  row's scaled shrink in its adapters' blocks (zeros elsewhere), so no [T, O] delta exists. Costs
  the extra K (2*J*n*R*O FLOPs), the shrink against n blocks (max(e*I, 2*I*J*n*R/beta)), x written
  a second time, into the wide buffer, by its producer (e*I: inductor writes a pointwise producer's
  output into the cat; a copy when x comes from another kernel), and W_ext = cat(W, B_step^T) per
  call (2*e*O*(I + J*n*R) per step, not per row: paid off only by layouts of thousands of rows).
                                                  e*I + max(e*I, 2*I*J*n*R/beta) + 2*J*n*R*O/beta
- "activation": grouped's shrink; the expand runs inside the kernel of the activation that consumes
  the output (mstar::lora_activation: GELU for Wan's FFN in, SwiGLU for Z-Image's w1/w3), tile by
  tile on tensor cores before the activation, so the delta is never written nor read. Only for a
  Linear whose consumer fuses it (the family's kernel FFN says so; its LoRA target names the path);
  alone, the layer computes grouped. The shrink output is written and read (2*e*J*k*R), and the
  gathered B and the shrink's rows are re-read from L2 per tile (not counted). `python -m
  mstar.bench.lora_step --paths grouped,activation` times a step both ways; `python -m
  mstar.bench.lora_activation` the kernel alone, per tile config.
                                                             e*I + 2*e*J*k*R

The rule (`choose_path`, static per Linear: no recompiles): "concat" where it moves fewer bytes
than "epilogue" with every slot in the step, on a layout its family marks as many rows (costed at
MIN_PACKED_ROWS: one request's tokens), else "grouped". Bytes per row at 4096 rows, R = 32, k = 1,
4 slots (grouped with its cat unfused for J > 1):
    Linear (I -> O, J)                     grouped  epilogue   concat
    Wan / FLUX.2 attention out  3072 -> 3072  1    18432    18432    25820
    Wan FFN in                  3072 -> 14336 1    63488    63488    75438
    Wan FFN out                14336 -> 3072  1    40960    40960   104668
    Wan q/k/v                   3072 -> 9216  3    79872    48906    84434
    Z-Image w1/w3               3840 -> 20480 2   171520    96154   151859
    FLUX.2 single qkv+MLP       3072 -> 27648 1   116736   116736   134077
and "activation", where the consumer fuses it: Wan FFN in 6272, Z-Image w1/w3 7936 (a step's
LoRA bytes less about 30% for Wan and 40% for Z-Image). The H200 did not bear the byte model out:
Wan's step with four adapters measured +16.8% on this path (its kernel on its slowest tiles then)
against +15.5% grouped, and the fastest tiles' kernel timings put it near +13.5%.
Concat loses on the per-step weight copy (4*O*I bytes over 4096 rows is ~3 more O-wide passes) and
the n-fold extra K; at Wan's 24960 rows its FFN in costs 37990 against 63488, so it pays only for
steps of several requests and few slots of low rank, which a static rule cannot see: every family
layout takes "grouped" today, but for the FFN Linears whose family target names "activation".
`lora_path_table` prints the table for any config.

Why "grouped" and not "epilogue", which the table ranks first: measured on the H200, a Linear
compiled alone runs epilogue fastest (`python -m mstar.engine.lora.bench`: Wan's FFN out +16%
against grouped's +29%; alone, grouped's add is a pass of its own), but in the served step, where
the add and the slices' cat fuse into the kernel that consumes the output (a residual, an
activation), grouped was the faster in all three families (`python -m mstar.bench.lora_step`: a
step +14.1 / 13.8 / 12.1% for Wan / Z-Image / FLUX.2 against epilogue's +14.5 / 15.3 / 16.3%, in two
runs). `lora_step --paths grouped,epilogue` times both in one run.

Every path computes the same sum; a segment without adapters adds exact zeros (grouped, epilogue)
or multiplies zero columns (concat). CPU and float32 under compile: a loop over the segments
(reads `ends` on the host) stands in for `torch._grouped_mm`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LINEAR_PATHS = ("grouped", "epilogue", "concat")  # the ways a Linear alone adds its update
PATHS = (*LINEAR_PATHS, "activation")
FLOPS_PER_BYTE = 200  # H100 / H200 bf16 dense over HBM bandwidth
ELEMENT_BYTES = 2  # bf16
MIN_PACKED_ROWS = 4096  # a layout of many rows: one 1024x1024 image's tokens, two Wan 480p labels
BIAS_COLUMNS = 8  # the ones column that carries the bias, padded to 16 bytes of bf16


def path_bytes_per_row(
    in_features: int, out_features: int, num_slices: int, num_adapters: int, rank: int, rows: int
) -> dict[str, float]:
    """Memory traffic (and extra FLOPs as bytes at FLOPS_PER_BYTE) each path adds per row, for a
    step of `rows` rows with `num_adapters` distinct adapters (one per segment)."""
    e, beta = ELEMENT_BYTES, FLOPS_PER_BYTE
    i, o, j, n, r = in_features, out_features, num_slices, num_adapters, rank
    grouped = e * (i + 2 * o) + (2 * e * o if j > 1 else 0)
    epilogue = e * (i + 2 * o) + 2 * (j - 1) * r * o / beta
    weight_copy = 2 * e * o * (i + j * n * r) / max(rows, 1)
    concat = e * i + max(e * i, 2 * i * j * n * r / beta) + 2 * j * n * r * o / beta + weight_copy
    activation = e * i + 2 * e * j * r  # one adapter per segment: k = 1
    return {"grouped": grouped, "epilogue": epilogue, "concat": concat, "activation": activation}


def choose_path(
    in_features: int, out_features: int, num_slices: int, num_slots: int, rank: int, many_rows: bool
) -> str:
    """The path a Linear takes: concat where it moves fewer bytes than epilogue with every slot in
    the step, on a layout of many rows (the weight copy is per step); else grouped (measured faster
    than epilogue in the served step, where its add fuses into the consumer)."""
    if not many_rows:
        return "grouped"
    cost = path_bytes_per_row(in_features, out_features, num_slices, num_slots, rank, MIN_PACKED_ROWS)
    return "concat" if cost["concat"] < cost["epilogue"] else "grouped"


def lora_path_table(shapes, num_slots: int, rank: int) -> list[str]:
    """Lines of the docstring's table for (name, in, out, slices) shapes."""
    lines = []
    for name, i, o, j in shapes:
        cost = path_bytes_per_row(i, o, j, num_slots, rank, MIN_PACKED_ROWS)
        picked = choose_path(i, o, j, num_slots, rank, True)
        numbers = "  ".join(f"{path} {cost[path]:.0f}" for path in PATHS)
        lines.append(f"{name} {i}->{o} x{j}: bytes/row {numbers}; picked {picked}")
    return lines


def segment_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] @ w[s] [K, N] for the rows of each segment s (ends: int32 [S] cumulative; None:
    one segment over every row) -> [T, N]."""
    if ends is None:
        return x @ w[0]
    if grouped_mm_takes(x, w):
        return torch._grouped_mm(x.contiguous(), w.contiguous(), offs=ends)
    out = x.new_zeros(x.shape[0], w.shape[-1])
    start = 0
    for segment, end in enumerate(ends.tolist()):
        out[start:end] = x[start:end] @ w[segment]
        start = end
    return out


def grouped_mm_takes(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether torch._grouped_mm runs these shapes (all static: the choice never recompiles): its
    rows must be 16-byte aligned, it takes 16 and 32-bit floats, and torch.compile traces it in
    bf16 only."""
    if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    if torch.compiler.is_compiling() and x.dtype != torch.bfloat16:
        return False
    widths = [x.shape[-1], *(w.shape[-1] for w in weights)]
    return all(width * x.element_size() % 16 == 0 for width in widths)


def _block_diagonal(bs: list[torch.Tensor], out_features: int) -> torch.Tensor:
    """Slices' [..., R, out_j] side by side: [..., J, R, out] with slice j in its output columns."""
    blocks, column = [], 0
    for b in bs:
        width = b.shape[-1]
        blocks.append(F.pad(b, (column, out_features - column - width)))
        column += width
    return torch.stack(blocks, dim=-3)


def epilogue_linear(x, weight, bias, a, bs, rows) -> torch.Tensor:
    """x [T, I] -> x @ W.T + b + the segments' LoRA: one shrink, one block-diagonal expand (the
    bias in it), added in the base GEMM's epilogue."""
    num_segments, width = rows.slots.shape
    out_features = weight.shape[0]
    # [S, K, I, J, R] -> [S, I, J, K, R]: slice j's columns for all K adapters side by side
    a_seg = a[rows.slots].permute(0, 2, 3, 1, 4).reshape(num_segments, x.shape[1], -1)
    hidden = segment_mm(x, a_seg, rows.ends)  # [T, J*K*R]
    scaled = [b[rows.slots] * rows.scales.to(b.dtype)[:, :, None, None] for b in bs]  # [S, K, R, out_j]
    b_seg = _block_diagonal(scaled, out_features)  # [S, K, J, R, out]
    b_seg = b_seg.transpose(1, 2).reshape(num_segments, -1, out_features)  # rows (j, k, r)
    if bias is not None:
        ones = hidden.new_zeros(hidden.shape[0], BIAS_COLUMNS)
        ones[:, 0] = 1
        hidden = torch.cat([hidden, ones], dim=1)
        bias_rows = b_seg.new_zeros(num_segments, BIAS_COLUMNS, out_features)
        bias_rows[:, 0] = bias.to(b_seg.dtype)
        b_seg = torch.cat([b_seg, bias_rows], dim=1)
    delta = segment_mm(hidden, b_seg, rows.ends)  # [T, out], the bias included
    return torch.addmm(delta, x, weight.t())


def concat_linear(x, weight, bias, a, bs, rows) -> torch.Tensor:
    """x [T, I] -> [x | H] @ [W ; B_step].T + b in one GEMM: H [T, J*n*R] is each row's shrink,
    scaled, in its adapters' blocks of the step's n adapters (rows.step_slots)."""
    num_segments = rows.slots.shape[0]
    out_features = weight.shape[0]
    # mix [S, K, n]: adapter k of segment s is block b, at its scale; A placed in those blocks
    placed = torch.einsum("skb,skijr->sijbr", rows.mix.to(a.dtype), a[rows.slots])
    a_seg = placed.reshape(num_segments, x.shape[1], -1)  # [S, I, J*n*R], columns (j, b, r)
    hidden = segment_mm(x, a_seg, rows.ends)
    b_step = _block_diagonal([b[rows.step_slots] for b in bs], out_features)  # [n, J, R, out]
    b_step = b_step.transpose(0, 1).reshape(-1, out_features)  # rows (j, b, r)
    wide_weight = torch.cat([weight, b_step.t().to(weight.dtype)], dim=1)  # [out, I + J*n*R]
    return F.linear(torch.cat([x, hidden], dim=1), wide_weight, bias)
