"""The torch backend (SDPA per segment on CPU) against an independent dense masked attention,
the layout type, the custom op under torch.compile, and build_engine_resources."""

from __future__ import annotations

import random

import pytest
import torch

from mstar.config import ServerConfig
from mstar.engine.attention import AttentionLayout, build_attention, reference_attention
from mstar.engine.resources import build_engine_resources
from mstar.engine.workspace import release_workspaces


def dense_masked_attention(q, k, v, layout: AttentionLayout) -> torch.Tensor:
    """One softmax over all packed tokens with a block-diagonal (and bottom-right causal) mask."""
    allowed = torch.zeros(layout.total_q, layout.total_kv, dtype=torch.bool)
    q_start = kv_start = 0
    for q_len, kv_len in zip(layout.q_lens, layout.kv_lens, strict=True):
        rows = torch.arange(q_len).unsqueeze(1)
        cols = torch.arange(kv_len).unsqueeze(0)
        block = (
            cols <= rows + (kv_len - q_len) if layout.causal else torch.ones(q_len, kv_len, dtype=torch.bool)
        )
        allowed[q_start : q_start + q_len, kv_start : kv_start + kv_len] = block
        q_start, kv_start = q_start + q_len, kv_start + kv_len
    scores = torch.einsum("qhd,khd->hqk", q, k) / q.shape[-1] ** 0.5  # [H, Tq, Tkv]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def random_layout(rng: random.Random, num_segments: int, causal: bool, cross: bool) -> AttentionLayout:
    q_lens = [rng.randint(1, 40) for _ in range(num_segments)]
    if cross:
        return AttentionLayout.cross_attention(q_lens, [rng.randint(1, 12) for _ in range(num_segments)])
    return AttentionLayout.self_attention(q_lens, causal=causal)


@pytest.fixture(scope="module")
def torch_attention():
    return build_attention("torch", "cpu", torch.float32, workspace_mb=1)


@pytest.mark.parametrize("num_segments", [1, 2, 5])
@pytest.mark.parametrize(("causal", "cross"), [(False, False), (True, False), (False, True)])
def test_torch_backend_matches_dense_attention(torch_attention, num_segments, causal, cross):
    rng = random.Random(num_segments * 10 + causal * 2 + cross)
    layout = random_layout(rng, num_segments, causal, cross)
    generator = torch.Generator().manual_seed(num_segments)
    q = torch.randn(layout.total_q, 3, 16, generator=generator)
    k = torch.randn(layout.total_kv, 3, 16, generator=generator)
    v = torch.randn(layout.total_kv, 3, 16, generator=generator)
    label = "cross" if cross else "self"
    torch_attention.plan(label, layout)
    out = torch_attention.run(label, q, k, v)
    torch.testing.assert_close(out, dense_masked_attention(q, k, v, layout), rtol=1e-5, atol=1e-5)


def test_value_head_dim_may_differ():
    layout = AttentionLayout.cross_attention((3, 4), (2, 5))
    q, k = torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    v = torch.randn(7, 2, 4)
    assert reference_attention(q, k, v, layout).shape == (7, 2, 4)


def test_layout_is_hashable_and_validated():
    assert hash(AttentionLayout((1, 2), (1, 2))) == hash(AttentionLayout([1, 2], [1, 2]))
    assert AttentionLayout((1, 2), (1, 2)) != AttentionLayout((1, 2), (1, 2), causal=True)
    assert AttentionLayout.self_attention((3, 5)).cu_seqlens_q() == [0, 3, 8]
    with pytest.raises(ValueError, match="2 query segments but 1 key"):
        AttentionLayout((1, 2), (3,))
    with pytest.raises(ValueError, match=">= 1"):
        AttentionLayout((0,), (1,))


def test_run_compiles_into_one_graph_with_a_dynamic_pack_length(torch_attention):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    projection = torch.nn.Linear(16, 48)

    def layer(x: torch.Tensor) -> torch.Tensor:  # x [T, 16]
        q, k, v = projection(x).view(x.shape[0], 3, 2, 8).unbind(1)  # each [T, 2, 8]
        return torch_attention.run("self", q, k, v).flatten(1) + x

    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=True)
    with torch.no_grad():
        for lens in [(5, 9), (4, 4, 7), (11, 2, 3, 6)]:
            layout = AttentionLayout.self_attention(lens)
            torch_attention.plan("self", layout)
            x = torch.randn(layout.total_q, 16)
            torch.testing.assert_close(compiled(x), layer(x))
    assert counter.frame_count == 1  # new layouts and lengths reuse the graph


def test_inputs_are_cast_to_the_resource_dtype(torch_attention):
    layout = AttentionLayout.self_attention((3, 4))
    torch_attention.plan("cast", layout)
    q, k, v = (torch.randn(7, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    out = torch_attention.run("cast", q, k, v)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, reference_attention(q.float(), k.float(), v.float(), layout))


def test_custom_op_fake_matches_real(torch_attention):
    layout = AttentionLayout.cross_attention((3, 4), (2, 5))
    torch_attention.plan("opcheck", layout)
    label_id = torch_attention._label_ids["opcheck"]
    q, k, v = torch.randn(7, 2, 8), torch.randn(7, 2, 8), torch.randn(7, 2, 8)
    torch.library.opcheck(
        torch.ops.mstar.ragged_attention.default,
        (q, k, v, torch_attention._instance_id, label_id),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_build_engine_resources_from_config():
    release_workspaces()
    config = ServerConfig(attention_backend="torch", workspace_mb=2)
    resources = build_engine_resources(config, "cpu", torch.float32)
    assert resources.attention.backend_name == "torch"
    assert resources.workspace.numel() == 2 * 1024 * 1024 and resources.workspace.dtype == torch.uint8
    assert resources.attention.workspace is resources.workspace
    again = build_engine_resources(config, "cpu", torch.float32)
    assert again.workspace is resources.workspace  # one workspace per device in a process
    release_workspaces()


def test_build_engine_resources_reports_a_bad_backend():
    config = ServerConfig(attention_backend="fa3", workspace_mb=1)
    with pytest.raises(ValueError, match="'fa3' cannot run on cpu"):
        build_engine_resources(config, "cpu", torch.float32)
