"""A fake flashinfer module for the paged wrappers, on CPU: the constructors and plan() take the
arguments FlashInfer 0.7.2 names (keyword-only where it is), run() computes from the planned page
table with SDPA. It records every plan, so tests see what the backend handed over."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class FakePagedFlashInfer:
    __version__ = "0.7.2+fake"

    def __init__(self) -> None:
        self.wrappers: list[Any] = []

    def BatchDecodeWithPagedKVCacheWrapper(  # noqa: N802
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
    ):
        wrapper = _FakeWrapper("decode", kv_layout, use_cuda_graph, paged_kv_indices_buffer)
        self.wrappers.append(wrapper)
        return wrapper

    def BatchPrefillWithPagedKVCacheWrapper(  # noqa: N802
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
        variant_owns_mask=False,
    ):
        wrapper = _FakeWrapper("prefill", kv_layout, use_cuda_graph, paged_kv_indices_buf, backend)
        self.wrappers.append(wrapper)
        return wrapper

    @property
    def plans(self) -> list[dict[str, Any]]:
        return [plan for wrapper in self.wrappers for plan in wrapper.plans]


class _FakeWrapper:
    def __init__(self, kind, kv_layout, use_cuda_graph, indices_buffer, backend="auto"):
        assert kv_layout == "NHD"
        self.kind, self.use_cuda_graph, self.backend = kind, use_cuda_graph, backend
        self.indices_buffer = indices_buffer
        self.plans: list[dict[str, Any]] = []
        self._plan: dict[str, Any] | None = None

    def plan(self, *args, **kwargs):
        if self.kind == "decode":
            return self._decode_plan(*args, **kwargs)
        return self._prefill_plan(*args, **kwargs)

    def _decode_plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
        q_data_type="float16", kv_data_type=None, sm_scale=None, non_blocking=True, **rest,
    ):  # fmt: skip
        qo = torch.arange(len(indptr), dtype=torch.int32)
        self._record(
            qo, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale
        )

    def _prefill_plan(
        self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
        num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
        causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None,
        window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16",
        kv_data_type=None, o_data_type=None, non_blocking=True, **rest,
    ):  # fmt: skip
        assert causal, "serving always plans causal prefill"
        self._record(
            qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim_qk, page_size, sm_scale,
        )  # fmt: skip

    def _record(self, qo, indptr, indices, last, num_qo_heads, num_kv_heads, head_dim, page_size, sm_scale):
        for tensor in (qo, indptr, indices, last):
            assert tensor.device.type == "cpu" and tensor.dtype == torch.int32, "host int32 page tables"
        if self.use_cuda_graph:
            assert len(indices) <= len(self.indices_buffer), "page indices beyond the captured buffer"
        self._plan = {
            "qo": qo.tolist(), "indptr": indptr.tolist(), "indices": indices.tolist(), "last": last.tolist(),
            "heads": (num_qo_heads, num_kv_heads, head_dim), "page_size": page_size, "scale": sm_scale,
        }  # fmt: skip
        self.plans.append(self._plan)

    def run(self, q, paged_kv_cache):
        plan = self._plan
        assert plan is not None and q.shape[0] == plan["qo"][-1]
        outputs = []
        for i in range(len(plan["qo"]) - 1):
            pages = plan["indices"][plan["indptr"][i] : plan["indptr"][i + 1]]
            kv_len = (len(pages) - 1) * plan["page_size"] + plan["last"][i]
            k = paged_kv_cache[pages, 0].flatten(0, 1)[:kv_len]  # [kv_len, Hkv, D]
            v = paged_kv_cache[pages, 1].flatten(0, 1)[:kv_len]
            q_seg = q[plan["qo"][i] : plan["qo"][i + 1]]
            rows = torch.arange(len(q_seg))[:, None] + (kv_len - len(q_seg))
            mask = torch.arange(kv_len)[None, :] <= rows
            out = F.scaled_dot_product_attention(
                q_seg.transpose(0, 1)[None], k.transpose(0, 1)[None].to(q.dtype), v.transpose(0, 1)[None].to(q.dtype),
                attn_mask=mask, scale=plan["scale"], enable_gqa=True,
            )  # fmt: skip
            outputs.append(out[0].transpose(0, 1))
        return torch.cat(outputs)
