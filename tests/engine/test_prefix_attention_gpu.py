"""PrefixAttention on every backend this GPU runs (bf16, grouped-query heads as Cosmos3's 32/8 and
16/8) against float32 SDPA per segment over [prefix ; own keys]."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mstar.engine.attention import PrefixAttention, PrefixLayout, StackedPrefixKV
from mstar.engine.attention.build import relative_error
from tests.engine.test_attention_gpu import attention_for

pytestmark = pytest.mark.gpu

BACKENDS = ["fa3", "flashinfer", "torch"]
HEAD_DIM = 128
MAX_RELATIVE_ERROR = 1e-2
LAYOUTS = [
    PrefixLayout(prefix_lens=(287, 141), q_lens=(3120, 3120)),  # a guidance pair
    PrefixLayout(prefix_lens=(287, 141, 95, 0), q_lens=(3120, 3120, 400, 17)),  # mixed requests
]


def _expected(layout, prefix_k, prefix_v, q, k, v) -> torch.Tensor:
    outs, q_start, p_start = [], 0, 0
    for prefix_len, q_len in zip(layout.prefix_lens, layout.q_lens, strict=True):
        own = slice(q_start, q_start + q_len)
        keys = torch.cat([prefix_k[p_start : p_start + prefix_len], k[own]]).float()
        values = torch.cat([prefix_v[p_start : p_start + prefix_len], v[own]]).float()
        out = F.scaled_dot_product_attention(
            q[own].float().transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), enable_gqa=True
        )
        outs.append(out.transpose(0, 1))
        q_start, p_start = q_start + q_len, p_start + prefix_len
    return torch.cat(outs)


@pytest.mark.parametrize("heads", [(32, 8), (16, 8)], ids=["nano-heads", "edge-heads"])
@pytest.mark.parametrize("case", range(len(LAYOUTS)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_attention_matches_sdpa(backend, case, heads):
    num_heads, num_kv_heads = heads
    dense = PrefixAttention(attention_for(backend))
    layout = LAYOUTS[case]
    generator = torch.Generator("cuda").manual_seed(case)

    def randn(*shape):
        return torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)

    prefixes = [randn(2, 2, n, num_kv_heads, HEAD_DIM) for n in layout.prefix_lens]  # two layers
    prefix = StackedPrefixKV(prefixes)
    dense.plan("generation", layout, prefix)
    for layer in range(2):
        q = randn(layout.total_q, num_heads, HEAD_DIM)
        k, v = randn(layout.total_q, num_kv_heads, HEAD_DIM), randn(layout.total_q, num_kv_heads, HEAD_DIM)
        out = dense.run("generation", layer, q, k, v)
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        expected = _expected(layout, *prefix.layer(layer), q, k, v)
        assert relative_error(out.float(), expected) <= MAX_RELATIVE_ERROR
    dense.release("generation")
