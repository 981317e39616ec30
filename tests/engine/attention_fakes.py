"""Fake fa3-fwd and FlashInfer modules for CPU tests: they record calls and compute with SDPA."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mstar.engine.attention import AttentionLayout, Platform, reference_attention

HOPPER = Platform(torch.device("cpu"), "NVIDIA H200", (9, 0))
AMPERE = Platform(torch.device("cpu"), "NVIDIA A100", (8, 0))
CPU = Platform(torch.device("cpu"))


def layout_from_offsets(cu_q: torch.Tensor, cu_kv: torch.Tensor, causal: bool) -> AttentionLayout:
    q_offsets, kv_offsets = cu_q.tolist(), cu_kv.tolist()
    q_lens = [b - a for a, b in zip(q_offsets[:-1], q_offsets[1:], strict=True)]
    kv_lens = [b - a for a, b in zip(kv_offsets[:-1], kv_offsets[1:], strict=True)]
    return AttentionLayout(tuple(q_lens), tuple(kv_lens), causal)


class FakeFA3:
    """Stands in for the module fa3_fwd_interface."""

    __version__ = "0.0.3+fake"

    def __init__(self, wrong_answers: bool = False) -> None:
        self.calls: list[dict[str, Any]] = []
        self.wrong_answers = wrong_answers

    def flash_attn_varlen_func(
        self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False
    ):
        self.calls.append(
            {
                "cu_q": cu_seqlens_q,
                "cu_kv": cu_seqlens_k,
                "max_q": max_seqlen_q,
                "max_kv": max_seqlen_k,
                "causal": causal,
            }
        )
        out = reference_attention(q, k, v, layout_from_offsets(cu_seqlens_q, cu_seqlens_k, causal))
        if self.wrong_answers:
            out = out + 1.0
        return out, torch.zeros(q.shape[1], q.shape[0])  # like fa3 builds that also return the lse


@dataclass
class FakeFlashInfer:
    """Stands in for the flashinfer module; `missing_kernels` holds kernel backends that fail at run."""

    __version__: str = "0.7.2+fake"
    missing_kernels: tuple[str, ...] = ()
    plan_error: Exception | None = None
    wrappers: list[FakeRaggedWrapper] = field(default_factory=list)

    def BatchPrefillWithRaggedKVCacheWrapper(self, workspace, kv_layout="NHD", **kwargs):  # noqa: N802
        wrapper = FakeRaggedWrapper(self, workspace, kv_layout, **kwargs)
        self.wrappers.append(wrapper)
        return wrapper

    @property
    def plan_calls(self) -> list[dict[str, Any]]:
        return [call for wrapper in self.wrappers for call in wrapper.plan_calls]


class FakeRaggedWrapper:
    def __init__(
        self,
        module: FakeFlashInfer,
        workspace: torch.Tensor,
        kv_layout: str,
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        kv_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        assert kv_layout == "NHD"
        self.module = module
        self.workspace = workspace
        self.use_cuda_graph = use_cuda_graph
        self.qo_indptr_buf = qo_indptr_buf
        self.kv_indptr_buf = kv_indptr_buf
        self.backend = backend
        self.plan_calls: list[dict[str, Any]] = []
        self.run_calls = 0
        self.schedule: AttentionLayout | None = None

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, **kwargs):
        call = {
            "qo_indptr": qo_indptr.tolist(),
            "kv_indptr": kv_indptr.tolist(),
            "heads": num_qo_heads,
            **kwargs,
        }
        self.plan_calls.append(call)
        if self.module.plan_error is not None:
            raise self.module.plan_error
        if self.use_cuda_graph:
            # FlashInfer's CUDA-graph mode copies into the buffers it was built with
            assert len(qo_indptr) == len(self.qo_indptr_buf), "batch size fixed in cuda graph mode"
            self.qo_indptr_buf.copy_(qo_indptr)
            self.kv_indptr_buf.copy_(kv_indptr)
        self.schedule = layout_from_offsets(qo_indptr, kv_indptr, kwargs.get("causal", False))

    def run(self, q, k, v):
        self.run_calls += 1
        if self.backend in self.module.missing_kernels:
            raise RuntimeError(f"no {self.backend} kernel for this GPU architecture")
        assert self.schedule is not None
        return reference_attention(q, k, v, self.schedule)


def random_qkv(layout: AttentionLayout, num_heads: int = 2, head_dim: int = 8, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(layout.total_q, num_heads, head_dim, generator=generator)
    k = torch.randn(layout.total_kv, num_heads, head_dim, generator=generator)
    v = torch.randn(layout.total_kv, num_heads, head_dim, generator=generator)
    return q, k, v
