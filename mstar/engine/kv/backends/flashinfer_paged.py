"""FlashInfer over the pool: BatchDecodeWithPagedKVCacheWrapper for the decode rows and
BatchPrefillWithPagedKVCacheWrapper (causal) for the prefill chunks of one step.

Each is planned once per step on the host (page tables from pinned host buffers, FlashInfer's own
non-blocking copies) and run in every layer against that layer's [pages, 2, page_tokens, kv_heads,
head_dim] view (NHD). A captured wrapper (CUDA graphs) is decode-only, for a fixed row count, with
device buffers that keep their addresses: FlashInfer copies each plan's page table into them
(the page indices from a device copy queued here: no plan waits for the device).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mstar.engine.kv.attention import PagedBackend, PagedHeads, PagedWrapper
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVPool

# decode with tensor cores pays off from this many query heads per kv head (SGLang's rule)
TENSOR_CORE_GROUP = 4


class FlashInferPagedBackend(PagedBackend):
    name = "flashinfer"

    def __init__(
        self,
        device: torch.device,
        heads: PagedHeads,
        library: Any,
        library_version: str,
        kernel_backend: str,
        workspace: torch.Tensor,
        max_pages: int,
    ) -> None:
        self.device = device
        self.heads = heads
        self.library = library
        self.kernel_backend = kernel_backend
        self.workspace = workspace  # shared by every wrapper: they run one after another on one stream
        self.max_pages = max_pages  # page-table capacity of a captured wrapper
        self.version = f"flashinfer-python {library_version} (prefill kernel backend {kernel_backend})"
        self.use_tensor_cores = heads.num_q_heads // heads.num_kv_heads >= TENSOR_CORE_GROUP

    def make_wrapper(self, captured: bool, num_rows: int | None = None) -> PagedWrapper:
        return FlashInferPagedWrapper(self, captured, num_rows)


class FlashInferPagedWrapper(PagedWrapper):
    def __init__(self, backend: FlashInferPagedBackend, captured: bool, num_rows: int | None) -> None:
        super().__init__(backend.device, captured)
        self._backend = backend
        self._num_rows = num_rows
        self._decode: Any = None
        self._prefill: Any = None
        self._layout: PagedLayout | None = None
        self._pin = backend.device.type == "cuda"
        self._staged: torch.cuda.Event | None = None  # recorded after a plan's copies were queued
        if captured:
            if num_rows is None:
                raise ValueError("a CUDA-graph paged wrapper needs its row count")
            self._decode = self._new_decode_wrapper()

    # ---- FlashInfer wrappers ---------------------------------------------------------------

    def _new_decode_wrapper(self) -> Any:
        backend = self._backend
        cls = backend.library.BatchDecodeWithPagedKVCacheWrapper
        with torch.inference_mode(False):
            if not self.captured:
                return cls(backend.workspace, "NHD", use_tensor_cores=backend.use_tensor_cores)
            rows = self._num_rows
            return cls(
                backend.workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=backend.use_tensor_cores,
                paged_kv_indptr_buffer=torch.zeros(rows + 1, dtype=torch.int32, device=self.device),
                paged_kv_indices_buffer=torch.zeros(backend.max_pages, dtype=torch.int32, device=self.device),
                paged_kv_last_page_len_buffer=torch.zeros(rows, dtype=torch.int32, device=self.device),
            )

    def _new_prefill_wrapper(self) -> Any:
        backend = self._backend
        with torch.inference_mode(False):
            return backend.library.BatchPrefillWithPagedKVCacheWrapper(
                backend.workspace, "NHD", backend=backend.kernel_backend
            )

    # ---- plan and run ----------------------------------------------------------------------

    def _plan_kernel(self, layout: PagedLayout) -> None:
        # FlashInfer stages each plan through its own pinned host buffer: the copy of the last
        # plan must have left it before it is rewritten (the host runs a step ahead of the device)
        if self._staged is not None and not self._staged.query():
            self._staged.synchronize()
        self._layout = None
        heads = self._backend.heads
        common = dict(q_data_type=heads.dtype, kv_data_type=heads.dtype, sm_scale=heads.scale)
        decode, prefill = (
            layout.part(0, layout.num_decode),
            layout.part(layout.num_decode, layout.num_segments),
        )
        if self.captured and (prefill is not None or layout.num_segments != self._num_rows):
            raise ValueError(f"a captured paged wrapper runs {self._num_rows} decode rows only")
        if decode is not None:
            self._decode = self._decode or self._new_decode_wrapper()
            indptr, indices, last = _page_table(decode, self._pin)
            if self.captured:
                indices = self._on_device(indices)
            self._decode.plan(
                indptr, indices, last, heads.num_q_heads, heads.num_kv_heads, heads.head_dim,
                heads.page_tokens, non_blocking=True, **common,
            )  # fmt: skip
        if prefill is not None:
            self._prefill = self._prefill or self._new_prefill_wrapper()
            indptr, indices, last, qo_indptr = _page_table(prefill, self._pin, with_qo=True)
            self._prefill.plan(
                qo_indptr, indptr, indices, last, heads.num_q_heads,
                heads.num_kv_heads, heads.head_dim, heads.page_tokens, causal=True,
                non_blocking=True, **common,
            )  # fmt: skip
        self._layout = layout
        if self._pin:
            self._staged = torch.cuda.Event()
            self._staged.record(torch.cuda.current_stream(self.device))

    def _on_device(self, pinned: torch.Tensor) -> torch.Tensor:
        """A captured wrapper copies the page indices into its buffer with a blocking copy unless
        they are on its device already; a blocking copy waits for every queued step, so the host
        could never plan step n + 1 while the device runs step n. Queued here instead, on the
        device FlashInfer compares with (its workspace's, which names the index)."""
        return pinned.to(self._backend.workspace.device, non_blocking=True)

    def run_paged(self, q: torch.Tensor, pool: KVPool, layer: int) -> torch.Tensor:
        layout = self._layout
        assert layout is not None, "run before plan"
        cache = pool.layer(layer)
        num_decode = layout.num_decode
        if num_decode == layout.num_segments:
            return self._decode.run(q, cache)
        if num_decode == 0:
            return self._prefill.run(q, cache)
        return torch.cat([self._decode.run(q[:num_decode], cache), self._prefill.run(q[num_decode:], cache)])


def _page_table(layout: PagedLayout, pin: bool, with_qo: bool = False) -> tuple[torch.Tensor, ...]:
    """(kv page indptr, page indices, last page lens), then the qo indptr when asked, as host int32
    tensors: views of one (pinned) buffer, so a plan stages one host copy, not one per array."""
    arrays = [layout.kv_page_indptr, layout.kv_page_indices, layout.kv_last_page_lens]
    if with_qo:
        arrays.append(layout.qo_indptr)
    staged = _host(np.concatenate(arrays), pin)
    return tuple(torch.split(staged, [len(a) for a in arrays]))


def _host(array: np.ndarray, pin: bool) -> torch.Tensor:
    """A host copy, pinned for a GPU: FlashInfer plans on the host and copies it to the device
    without a sync."""
    tensor = torch.from_numpy(np.ascontiguousarray(array, dtype=np.int32))
    return tensor.pin_memory() if pin else tensor
