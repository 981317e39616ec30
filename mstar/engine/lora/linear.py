"""The segmented LoRA linear: requests with different adapters (or none) in one packed matmul.

A packed step's rows are segments, one per (request, label), each with up to K adapters:
    y = x @ W.T + b + sum_k scale_k * (x_seg @ A_k) @ B_k     for the rows of each segment,
never merged into W. Adapter weights live in per-layer slot buffers ([slots, in, J, R] for A,
[slots, R, out_j] for each of J output slices; slot 0 stays zero; R is max_lora_rank, smaller ranks
zero-padded), so loading an adapter writes tensor contents and compiles nothing. A fused projection
(q/k/v as one GEMM) carries one slice per original projection.

Which segment holds which slots and scales is the per-step `LoraContext`, set once per step by the
DiT forward and read by every wrapped layer (as attention plans are): `LoraRows` per row layout
("tokens", "text", ...), small tensors a compiled layer stack takes as inputs. Segment counts and
pack lengths are dynamic dimensions: one graph serves every step with adapters (one more for steps
with none, which run the base layer alone).

How a layer adds the update is its `lora_path` (paths.py: "grouped", "epilogue", "concat" or
"activation"; "grouped" is this file's `torch._grouped_mm` shrink and per-slice expands, the CUDA
grouped GEMM in bf16 on Hopper, a loop of matmuls on the CPU; "activation" is grouped when the
layer runs alone, and lets the module consuming its output apply the expand inside its activation:
activation.py); `reference_lora_delta` is the plain per-segment definition.
Compiled float32 (which `_grouped_mm` does not trace) takes a loop over the segments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mstar.engine.lora.paths import PATHS, concat_linear, epilogue_linear, grouped_mm_takes
from mstar.engine.transfer import to_device

MIN_SEGMENTS = 2  # torch.compile specialises a dimension of size 1; pad with an empty segment


@dataclass
class LoraRows:
    """Which adapters each segment of one packed row layout applies.

    ends: int32 [S], each segment's end row (cumulative, the last one every row of the layout;
    None: one segment over every row).
    slots: int64 [S, K], slot ids (0: the zero slot, for padding). scales: [S, K] (0 for padding).
    step_slots: int64 [n], the step's distinct slots (at least MIN_SEGMENTS, padded with 0).
    """

    ends: torch.Tensor | None
    slots: torch.Tensor
    scales: torch.Tensor
    step_slots: torch.Tensor

    @property
    def mix(self) -> torch.Tensor:
        """[S, K, n]: scales[s, k] where step_slots[b] is slots[s, k] (a real slot), else 0 (where
        the concat path places each adapter's columns); derived on the device when used."""
        slots = self.slots[:, :, None]
        placed = (slots == self.step_slots) & (slots != 0)
        return torch.where(placed, self.scales[:, :, None], torch.zeros((), dtype=self.scales.dtype))

    @classmethod
    def build(
        cls,
        lengths: Sequence[int],
        adapters: Sequence[Sequence[tuple[int, float]]],
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> LoraRows | None:
        """Rows of segments of `lengths` rows, segment i applying `adapters[i]` ((slot, scale)
        pairs, possibly none); None when no segment applies any (the layers run their base alone)."""
        if len(lengths) != len(adapters):
            raise ValueError(f"{len(lengths)} segments but {len(adapters)} adapter lists")
        if not any(adapters):
            return None
        ends, total = [], 0
        for length in lengths:
            total += int(length)
            ends.append(total)
        pairs = [list(pair) for pair in adapters]
        while len(ends) < MIN_SEGMENTS:
            ends.append(total)
            pairs.append([])
        return cls._from_pairs(ends, pairs, device, dtype)

    @classmethod
    def uniform(
        cls, adapters: Sequence[tuple[int, float]], device: torch.device | str, dtype: torch.dtype
    ) -> LoraRows | None:
        """Every row applies `adapters` (a forward of one request: text keys, a caption refiner)."""
        return cls._from_pairs(None, [list(adapters)], device, dtype) if adapters else None

    @classmethod
    def _from_pairs(cls, ends, pairs, device, dtype) -> LoraRows:
        width = max(1, max(len(p) for p in pairs))
        slots = [[slot for slot, _ in p] + [0] * (width - len(p)) for p in pairs]
        scales = [[float(scale) for _, scale in p] + [0.0] * (width - len(p)) for p in pairs]
        if any(slot < 0 for row in slots for slot in row):
            raise ValueError("slot ids are >= 0 (0 is the zero slot)")
        step = sorted({slot for row in slots for slot in row if slot})
        step += [0] * (MIN_SEGMENTS - len(step))  # a dimension of size 1 would be specialised
        return cls(
            ends=None if ends is None else to_device(torch.tensor(ends, dtype=torch.int32), device),
            slots=to_device(torch.tensor(slots, dtype=torch.int64), device),
            scales=to_device(torch.tensor(scales, dtype=dtype), device),
            step_slots=to_device(torch.tensor(step, dtype=torch.int64), device),
        )


class LoraContext:
    """The step's LoraRows by row layout; every wrapped layer of a model reads the same context."""

    def __init__(self) -> None:
        self.layouts: dict[str, LoraRows] = {}

    def set(self, layout: str, rows: LoraRows | None) -> None:
        if rows is None:
            self.layouts.pop(layout, None)
        else:
            self.layouts[layout] = rows

    def clear(self) -> None:
        self.layouts.clear()


class SegmentedLoraLinear(nn.Linear):
    """A Linear (same weight and bias Parameters, same state-dict keys) plus per-segment LoRA."""

    def __init__(
        self,
        base: nn.Linear,
        slice_features: Sequence[int],
        num_slots: int,
        max_rank: int,
        context: LoraContext,
        layout: str,
        path: str = "grouped",
    ):
        if sum(slice_features) != base.out_features:
            raise ValueError(f"slices {list(slice_features)} do not add up to {base.out_features} outputs")
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
        self.weight = base.weight
        self.bias = base.bias
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got '{path}'")
        self.lora_context = context
        self.lora_layout = layout
        self.lora_path = path  # static: which path a compiled graph takes never changes
        device, dtype = base.weight.device, base.weight.dtype
        shape = (num_slots, base.in_features, len(slice_features), max_rank)
        self.register_buffer("lora_a", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        for index, features in enumerate(slice_features):
            b = torch.zeros(num_slots, max_rank, features, device=device, dtype=dtype)
            self.register_buffer(f"lora_b{index}", b, persistent=False)
        self.num_slices = len(slice_features)

    def lora_b(self) -> list[torch.Tensor]:
        return [getattr(self, f"lora_b{index}") for index in range(self.num_slices)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = self.lora_context.layouts.get(self.lora_layout)
        if rows is None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)
        if self.lora_path in ("grouped", "activation"):  # "activation" alone: grouped
            y = F.linear(flat, self.weight, self.bias) + lora_delta(flat, self.lora_a, self.lora_b(), rows)
        else:
            path = epilogue_linear if self.lora_path == "epilogue" else concat_linear
            y = path(flat, self.weight, self.bias, self.lora_a, self.lora_b(), rows)
        return y.view(*x.shape[:-1], self.out_features)


def lora_delta(x: torch.Tensor, a: torch.Tensor, bs: list[torch.Tensor], rows: LoraRows) -> torch.Tensor:
    """sum_k scale_k * (x_seg @ A_k) @ B_k per segment; x [T, in] -> [T, sum(out_j)] in x's dtype."""
    if grouped_mm_takes(x, a, *bs):
        return grouped_lora_delta(x, a, bs, rows)
    return reference_lora_delta(x, a, bs, rows)


def grouped_lora_delta(
    x: torch.Tensor, a: torch.Tensor, bs: list[torch.Tensor], rows: LoraRows
) -> torch.Tensor:
    """Two grouped GEMMs (shrink to J*K*R, expand per slice) over the segments' gathered weights."""
    ends = segment_ends(rows, x)
    hidden = torch._grouped_mm(x.contiguous(), segment_a(a, rows), offs=ends)  # [T, J*K*R]
    block = hidden.shape[1] // len(bs)  # K*R columns per slice
    outs = []
    for index, b_seg in enumerate(segment_bs(bs, rows)):
        part = hidden[:, index * block : (index + 1) * block].contiguous()
        outs.append(torch._grouped_mm(part, b_seg, offs=ends))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def segment_ends(rows: LoraRows, x: torch.Tensor) -> torch.Tensor:
    """int32 [S]: the segments' cumulative end rows (one segment over x's rows where rows.ends is None)."""
    if rows.ends is not None:
        return rows.ends
    return torch.full((1,), x.shape[0], dtype=torch.int32, device=x.device)


def segment_a(a: torch.Tensor, rows: LoraRows) -> torch.Tensor:
    """Each segment's A for the shrink: [S, in, J*K*R], slice j's columns for all K adapters side
    by side."""
    num_segments = rows.slots.shape[0]
    # [S, K, in, J, R] -> [S, in, J, K, R]
    return a[rows.slots].permute(0, 2, 3, 1, 4).reshape(num_segments, a.shape[1], -1)


def segment_bs(bs: list[torch.Tensor], rows: LoraRows) -> list[torch.Tensor]:
    """Each segment's B per slice, scaled: [S, K*R, out_j], the K adapters' rows one after another."""
    num_segments = rows.slots.shape[0]
    scaled = [b[rows.slots] * rows.scales.to(b.dtype)[:, :, None, None] for b in bs]  # [S, K, R, out_j]
    return [b.reshape(num_segments, -1, b.shape[-1]) for b in scaled]


def reference_lora_delta(
    x: torch.Tensor, a: torch.Tensor, bs: list[torch.Tensor], rows: LoraRows
) -> torch.Tensor:
    """The definition, one segment and adapter at a time (reads the rows on the host)."""
    ends = [x.shape[0]] if rows.ends is None else rows.ends.tolist()
    slots, scales = rows.slots.tolist(), rows.scales.double().tolist()
    out = x.new_zeros(x.shape[0], sum(b.shape[-1] for b in bs))
    start = 0
    for segment, end in enumerate(ends):
        for slot, scale in zip(slots[segment], scales[segment], strict=True):
            if slot == 0 or scale == 0.0 or end == start:
                continue
            column = 0
            for index, b in enumerate(bs):
                width = b.shape[-1]
                update = (x[start:end] @ a[slot, :, index, :]) @ b[slot]
                out[start:end, column : column + width] += scale * update
                column += width
        start = end
    return out
