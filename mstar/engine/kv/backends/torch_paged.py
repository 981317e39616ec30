"""The PyTorch reference over pages: gather each segment's keys once per layer, SDPA per segment.

Exact on CPU (the dtype's own SDPA, an explicit bottom-right causal mask), and it runs on any
device, so it is what every other backend is checked against at boot. Decode rows are batched into
one SDPA over keys padded to the longest row (the padding masked out), so a step of many short
requests is not a Python loop per request and layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.kv.attention import PagedBackend, PagedHeads, PagedWrapper
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVPool


class TorchPagedBackend(PagedBackend):
    name = "torch"

    def __init__(self, device: torch.device, heads: PagedHeads) -> None:
        self.device = device
        self.heads = heads
        self.version = f"torch {torch.__version__}"

    def make_wrapper(self, captured: bool, num_rows: int | None = None) -> PagedWrapper:
        if captured:
            raise ValueError("the torch paged attention backend cannot run inside a CUDA graph")
        return TorchPagedWrapper(self.device, self.heads)


class TorchPagedWrapper(PagedWrapper):
    def __init__(self, device: torch.device, heads: PagedHeads) -> None:
        super().__init__(device)
        self.heads = heads
        self._layout: PagedLayout | None = None
        self._gather_rows: torch.Tensor | None = None
        self._decode_rows: torch.Tensor | None = None  # [D, max_kv] key rows, padded
        self._decode_mask: torch.Tensor | None = None  # [D, 1, 1, max_kv] True on real keys
        self._prefill_masks: list[torch.Tensor | None] = []

    def _plan_kernel(self, layout: PagedLayout) -> None:
        self._layout = layout
        tokens = layout.page_tokens

        def rows_of(slots):
            rows = torch.from_numpy(slots.copy())
            return ((rows // tokens) * (2 * tokens) + rows % tokens).to(self.device)

        self._gather_rows = rows_of(layout.gather_slots)
        self._plan_decode(layout, rows_of)
        self._prefill_masks = [
            _bottom_right_causal(q_len, kv_len, self.device)
            for q_len, kv_len in zip(
                layout.q_lens[layout.num_decode :], layout.kv_lens[layout.num_decode :], strict=True
            )
        ]

    def _plan_decode(self, layout: PagedLayout, rows_of) -> None:
        self._decode_rows = self._decode_mask = None
        if not layout.num_decode:
            return
        kv_lens = torch.tensor(layout.kv_lens[: layout.num_decode])
        width = int(kv_lens.max())
        starts = torch.from_numpy(layout.kv_indptr[: layout.num_decode].astype("int64"))
        valid = torch.arange(width)[None, :] < kv_lens[:, None]  # [D, width]
        index = torch.where(valid, starts[:, None] + torch.arange(width)[None, :], starts[:, None])
        self._decode_rows = index.to(self.device)  # into the gathered keys, not the pool
        self._decode_mask = valid[:, None, None, :].to(self.device)

    def run_paged(self, q: torch.Tensor, pool: KVPool, layer: int) -> torch.Tensor:
        layout = self._layout
        assert layout is not None and self._gather_rows is not None, "run before plan"
        if q.shape[0] != layout.total_q:
            raise ValueError(f"torch paged attention: q has {q.shape[0]} tokens, the plan {layout.total_q}")
        keys, values = pool.gather(layer, self._gather_rows)  # [total_kv, Hkv, D]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        outputs = []
        if layout.num_decode:
            outputs.append(self._decode(q[: layout.num_decode], keys, values))
        q_starts, kv_starts = layout.qo_indptr, layout.kv_indptr
        for offset, mask in enumerate(self._prefill_masks):
            index = layout.num_decode + offset
            q_seg = q[q_starts[index] : q_starts[index + 1]]
            k_seg = keys[kv_starts[index] : kv_starts[index + 1]]
            v_seg = values[kv_starts[index] : kv_starts[index + 1]]
            outputs.append(self._attend(q_seg[None], k_seg[None], v_seg[None], mask)[0])
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _decode(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """q [D, H, Dh] of the decode rows against their keys padded to the longest: one SDPA."""
        k = keys[self._decode_rows]  # [D, width, Hkv, Dh]
        v = values[self._decode_rows]
        return self._attend(q[:, None], k, v, self._decode_mask)[:, 0]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
        """q [B, Lq, H, Dh], k/v [B, Lk, Hkv, Dh], mask broadcastable to [B, H, Lq, Lk] -> [B, Lq, H, Dh]."""
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            scale=self.heads.scale,
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2)


def _bottom_right_causal(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    """Query i (position kv_len - q_len + i) sees keys 0 .. kv_len - q_len + i; None = no mask."""
    if q_len == 1:
        return None
    rows = torch.arange(q_len)[:, None] + (kv_len - q_len)
    return (torch.arange(kv_len)[None, :] <= rows).to(device)
