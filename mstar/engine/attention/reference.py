"""SDPA per segment: the CPU path of the torch backend and the reference every backend is checked against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.attention.layout import AttentionLayout


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout
) -> torch.Tensor:
    """q [Tq, H, D], k/v [Tkv, Hkv, D] packed segment after segment -> out [Tq, H, D].

    Causal masks align to the bottom right (the last query sees every key), as FlashAttention does
    when q and kv lengths differ. Hkv < H is grouped-query attention: query head h reads key/value
    head h // (H / Hkv), as the kernels do.
    """
    _check_shapes(q, k, v, layout)
    grouped = q.shape[1] != k.shape[1]
    out = q.new_empty((q.shape[0], q.shape[1], v.shape[2]))  # [Tq, H, Dv]
    q_start = kv_start = 0
    for q_len, kv_len in zip(layout.q_lens, layout.kv_lens, strict=True):
        # [S, H, D] -> [1, H, S, D] for SDPA
        q_seg = q[q_start : q_start + q_len].transpose(0, 1).unsqueeze(0)
        k_seg = k[kv_start : kv_start + kv_len].transpose(0, 1).unsqueeze(0)
        v_seg = v[kv_start : kv_start + kv_len].transpose(0, 1).unsqueeze(0)
        mask = _causal_mask(q_len, kv_len, q.device) if layout.causal else None
        out_seg = F.scaled_dot_product_attention(q_seg, k_seg, v_seg, attn_mask=mask, enable_gqa=grouped)
        out[q_start : q_start + q_len] = out_seg.squeeze(0).transpose(0, 1)
        q_start += q_len
        kv_start += kv_len
    return out


def _causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """Boolean [q_len, kv_len], True where query i may see key j (bottom-right aligned)."""
    rows = torch.arange(q_len, device=device).unsqueeze(1)
    cols = torch.arange(kv_len, device=device).unsqueeze(0)
    return cols <= rows + (kv_len - q_len)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"attention expects [T, H, D] tensors, got q{tuple(q.shape)} k{tuple(k.shape)}")
    if q.shape[0] != layout.total_q or k.shape[0] != layout.total_kv or v.shape[0] != layout.total_kv:
        raise ValueError(
            f"attention: q has {q.shape[0]} tokens and k/v {k.shape[0]}/{v.shape[0]}, "
            f"layout expects {layout.total_q} and {layout.total_kv}"
        )
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"attention: {q.shape[1]} query heads need a whole number of groups of the "
            f"{k.shape[1]} key and {v.shape[1]} value heads"
        )
