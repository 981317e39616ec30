"""An FFN's first Linear with its LoRA expand applied inside the activation after it.

    if fuses_lora(linear):                                   # wrapped, "activation" path, rows set
        h = lora_activation(linear, x, "gelu_tanh")          # == F.gelu(linear(x), approximate="tanh")

A family's kernel FFN module calls this where its first Linear is a SegmentedLoraLinear on the
"activation" path with rows set for the step (the step has adapters): the base GEMM as ever, the
grouped shrink, then one mstar::lora_activation kernel that adds each segment's expand tile by tile
before the activation ("swiglu": the Linear's two slices are the gate and the up projection). With
no adapters in the step the module keeps its plain code. The op is registered by importing
mstar.engine.kernels.lora_activation (the families' optimize does, with its other kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.lora.linear import SegmentedLoraLinear, segment_a, segment_bs, segment_ends
from mstar.engine.lora.paths import segment_mm

ACTIVATION_PATH = "activation"


def fuses_lora(linear: torch.nn.Module) -> bool:
    """Whether `linear` applies LoRA this step through its consumer's activation."""
    return (
        isinstance(linear, SegmentedLoraLinear)
        and linear.lora_path == ACTIVATION_PATH
        and linear.lora_layout in linear.lora_context.layouts
    )


def lora_activation(linear: SegmentedLoraLinear, x: torch.Tensor, activation: str) -> torch.Tensor:
    """act(linear(x)) with the step's LoRA, the expand inside the activation kernel. x [..., in] ->
    [..., out] ("gelu_tanh") or [..., out / 2] ("swiglu": gate | up slices)."""
    rows = linear.lora_context.layouts[linear.lora_layout]
    flat = x.reshape(-1, linear.in_features)
    y = F.linear(flat, linear.weight, linear.bias)  # [T, J*N]
    ends = segment_ends(rows, flat)
    hidden = segment_mm(flat, segment_a(linear.lora_a, rows), rows.ends)  # [T, J*K*R]
    b_seg = torch.stack(segment_bs(linear.lora_b(), rows), dim=1)  # [S, J, K*R, N]
    out = torch.ops.mstar.lora_activation(y, hidden, b_seg, ends, activation)
    return out.view(*x.shape[:-1], out.shape[-1])
