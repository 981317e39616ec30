"""FlashInfer ragged prefill (BatchPrefillWithRaggedKVCacheWrapper) with its own kernel backend choice."""

from __future__ import annotations

from typing import Any

import torch

from mstar.engine.attention.layout import AnyLayout, AttentionLayout
from mstar.engine.attention.wrapper import PlanWrapper, check_tokens

FLASHINFER_PACKAGE = "flashinfer"
FLASHINFER_KERNEL_BACKENDS = ("auto", "fa2", "fa3", "cudnn", "cutlass")

# (num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q dtype, kv dtype)
HeadShape = tuple[int, int, int, int, torch.dtype, torch.dtype]


class FlashInferBackend:
    name = "flashinfer"

    def __init__(
        self,
        device: torch.device,
        library: Any,
        library_version: str,
        kernel_backend: str,
        workspace: torch.Tensor,
    ) -> None:
        if kernel_backend not in FLASHINFER_KERNEL_BACKENDS:
            raise ValueError(
                f"flashinfer_backend '{kernel_backend}' is unknown; choose one of {FLASHINFER_KERNEL_BACKENDS}"
            )
        self.device = device
        self.library = library
        self.kernel_backend = kernel_backend
        self.workspace = workspace
        self.version = f"{FLASHINFER_PACKAGE} {library_version} (kernel backend {kernel_backend})"

    def make_wrapper(self, captured: bool) -> PlanWrapper:
        return FlashInferWrapper(self, captured)


class FlashInferWrapper(PlanWrapper):
    """FlashInfer's plan needs head counts and dims, which a layout lacks: the schedule is built at
    plan() when this wrapper has run before (it remembers the head shape), else at the first run()
    of the step; every later layer reuses it."""

    def __init__(self, backend: FlashInferBackend, captured: bool) -> None:
        super().__init__(backend.device, captured)
        self._backend = backend
        self._inner: Any = None
        self._layout: AnyLayout | None = None
        self._indptrs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._scheduled_heads: HeadShape | None = None
        self._last_heads: HeadShape | None = None

    def _plan_kernel(self, layout: AnyLayout) -> None:
        self._scheduled_heads = None
        self._layout = layout
        if isinstance(layout, AttentionLayout):
            # host (pinned) indptrs: FlashInfer plans on the host and copies them itself, non-blocking
            self._indptrs = self.stager.write_host(layout.cu_seqlens_q(), layout.cu_seqlens_kv())
        else:
            self.stager.reserve(layout.num_segments)
            self._indptrs = (layout.cu_seqlens_q, layout.cu_seqlens_kv)  # FlashInfer reads them back
        if self._last_heads is not None:
            self._schedule(self._last_heads)

    def _schedule(self, heads: HeadShape) -> None:
        assert self._layout is not None and self._indptrs is not None
        num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, q_dtype, kv_dtype = heads
        inner = self._inner_wrapper()
        inner.plan(
            self._indptrs[0],
            self._indptrs[1],
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo=head_dim_vo,
            causal=self._layout.causal,
            q_data_type=q_dtype,
            kv_data_type=kv_dtype,
            non_blocking=True,
        )
        self.stager.record_host_use()
        self._scheduled_heads = heads

    def _inner_wrapper(self) -> Any:
        if self._inner is not None:
            return self._inner
        # its buffers must be normal tensors: a later plan may run outside inference_mode
        with torch.inference_mode(False):
            self._inner = self._new_inner_wrapper()
        return self._inner

    def _new_inner_wrapper(self) -> Any:
        wrapper_class = self._backend.library.BatchPrefillWithRaggedKVCacheWrapper
        if self.captured:
            # CUDA-graph mode: FlashInfer copies indptrs into these fixed buffers at every plan
            qo_indptr_buf, kv_indptr_buf = self.stager.device_views()
            return wrapper_class(
                self._backend.workspace,
                "NHD",
                use_cuda_graph=True,
                qo_indptr_buf=qo_indptr_buf,
                kv_indptr_buf=kv_indptr_buf,
                backend=self._backend.kernel_backend,
            )
        return wrapper_class(self._backend.workspace, "NHD", backend=self._backend.kernel_backend)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._layout is not None, "run before plan"
        check_tokens(q, k, self._layout, "flashinfer")
        heads: HeadShape = (q.shape[1], k.shape[1], q.shape[2], v.shape[2], q.dtype, k.dtype)
        if heads != self._scheduled_heads:
            self._schedule(heads)
            self._last_heads = heads
        return self._inner.run(q, k, v)
