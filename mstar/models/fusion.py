"""Fused projections: several Linears over the same input as one GEMM (gpt-fast's wqkv, diffusers'
fuse_qkv_projections). Fusing renames the parameters, so it happens after the checkpoint is loaded
(state-dict keys stay diffusers' for loading) and before compile.
"""

from __future__ import annotations

import torch
from torch import nn


def concat_linears(linears: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output [T, sum(out)] is the given Linears' outputs side by side.

    The concatenated weight is new memory; the caller deletes the originals so memory stays flat.
    """
    first = linears[0]
    if any(linear.in_features != first.in_features for linear in linears):
        raise ValueError("fused linears must share their input size")
    has_bias = first.bias is not None
    if any((linear.bias is not None) != has_bias for linear in linears):
        raise ValueError("fused linears must all have a bias or all have none")
    with torch.no_grad():
        weight = torch.cat([linear.weight for linear in linears])  # [sum(out), in]
        bias = torch.cat([linear.bias for linear in linears]) if has_bias else None
    # Built on meta, then given the concatenated tensors: no throwaway init on the device.
    fused = nn.Linear(first.in_features, weight.shape[0], bias=has_bias, device="meta")
    requires_grad = first.weight.requires_grad
    fused.weight = nn.Parameter(weight, requires_grad=requires_grad)
    if bias is not None:
        fused.bias = nn.Parameter(bias, requires_grad=requires_grad)
    return fused
