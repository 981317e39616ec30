"""FA3 (fa3-fwd, Hopper) over pages gathered into a contiguous buffer per layer.

fa3-fwd 0.0.3 is built without paged KV, so each layer gathers its segments' keys and values
(one index_select each, rows staged once per plan) and runs `flash_attn_varlen_func` with the causal
mask aligned bottom-right (FlashAttention's rule when a segment has fewer queries than keys). The
gather reads every key once more than a paged kernel would: it can pay off on prefill-heavy steps,
seldom on long decodes; `mstar bench llm` measures it against FlashInfer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mstar.engine.kv.attention import PagedBackend, PagedHeads, PagedWrapper
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVPool
from mstar.engine.transfer import to_device


class FA3PagedBackend(PagedBackend):
    name = "fa3"

    def __init__(self, device: torch.device, heads: PagedHeads, library: Any, library_version: str) -> None:
        self.device = device
        self.heads = heads
        self.varlen = library.flash_attn_varlen_func
        self.version = f"fa3-fwd {library_version} (varlen over gathered pages)"

    def make_wrapper(self, captured: bool, num_rows: int | None = None) -> PagedWrapper:
        if captured:
            raise ValueError("the fa3 paged backend gathers with host-sized buffers: no CUDA graphs")
        return FA3PagedWrapper(self)


class FA3PagedWrapper(PagedWrapper):
    def __init__(self, backend: FA3PagedBackend) -> None:
        super().__init__(backend.device)
        self._backend = backend
        self._layout: PagedLayout | None = None
        self._gather_rows: torch.Tensor | None = None
        self._cu_q: torch.Tensor | None = None
        self._cu_kv: torch.Tensor | None = None

    def _plan_kernel(self, layout: PagedLayout) -> None:
        tokens = layout.page_tokens
        slots = layout.gather_slots
        rows = (slots // tokens) * (2 * tokens) + slots % tokens
        self._gather_rows = to_device(torch.from_numpy(rows.astype(np.int64)), self.device)
        self._cu_q = to_device(torch.from_numpy(layout.qo_indptr.copy()), self.device)
        self._cu_kv = to_device(torch.from_numpy(layout.kv_indptr.copy()), self.device)
        self._layout = layout

    def run_paged(self, q: torch.Tensor, pool: KVPool, layer: int) -> torch.Tensor:
        layout = self._layout
        assert layout is not None, "run before plan"
        keys, values = pool.gather(layer, self._gather_rows)
        out = self._backend.varlen(
            q,
            keys,
            values,
            self._cu_q,
            self._cu_kv,
            layout.max_q_len,
            layout.max_kv_len,
            softmax_scale=self._backend.heads.scale,
            causal=True,
        )
        return out[0] if isinstance(out, tuple) else out
