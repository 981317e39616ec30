"""PrefixAttention: each segment's queries attend to its prefix plus its own keys, planned once per
forward and run per layer, on every backend (fa3 and FlashInfer through the fakes), with the plan
cache's rules."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from mstar.engine.attention import PrefixAttention, PrefixLayout, StackedPrefixKV, build_attention
from mstar.engine.attention import prefix as prefix_module
from tests.engine.attention_fakes import HOPPER, FakeFA3, FakeFlashInfer

NUM_LAYERS, HEADS, KV_HEADS, HEAD_DIM = 3, 4, 2, 8
LAYOUT = PrefixLayout(prefix_lens=(5, 0, 7), q_lens=(6, 3, 4))
OTHER = PrefixLayout(prefix_lens=(5, 7), q_lens=(6, 4))


def _dense(
    backend: str = "torch", flashinfer: FakeFlashInfer | None = None, num_slots: int = 2
) -> PrefixAttention:
    ragged = build_attention(
        backend,
        "cpu",
        torch.float32,
        workspace_mb=1,
        num_slots=num_slots,
        libraries={"fa3": FakeFA3(), "flashinfer": flashinfer or FakeFlashInfer()},
        platform=HOPPER,
    )
    return PrefixAttention(ragged)


def _prefix(layout: PrefixLayout, seed: int) -> StackedPrefixKV:
    generator = torch.Generator().manual_seed(seed)
    return StackedPrefixKV(
        [torch.randn(NUM_LAYERS, 2, n, KV_HEADS, HEAD_DIM, generator=generator) for n in layout.prefix_lens]
    )


def _qkv(layout: PrefixLayout, seed: int):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(layout.total_q, HEADS, HEAD_DIM, generator=generator)
    k = torch.randn(layout.total_q, KV_HEADS, HEAD_DIM, generator=generator)
    v = torch.randn(layout.total_q, KV_HEADS, HEAD_DIM, generator=generator)
    return q, k, v


def _expected(layout: PrefixLayout, prefix: StackedPrefixKV, layer: int, q, k, v) -> torch.Tensor:
    """Per segment, SDPA over [its prefix ; its own keys], grouped-query."""
    prefix_k, prefix_v = prefix.layer(layer)
    outs, q_start, p_start = [], 0, 0
    for prefix_len, q_len in zip(layout.prefix_lens, layout.q_lens, strict=True):
        own = slice(q_start, q_start + q_len)
        keys = torch.cat([prefix_k[p_start : p_start + prefix_len], k[own]])
        values = torch.cat([prefix_v[p_start : p_start + prefix_len], v[own]])
        out = F.scaled_dot_product_attention(
            q[own].transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), enable_gqa=True
        )
        outs.append(out.transpose(0, 1))
        q_start, p_start = q_start + q_len, p_start + prefix_len
    return torch.cat(outs)


@pytest.mark.parametrize("backend", ["torch", "fa3", "flashinfer"])
def test_each_segment_attends_to_its_prefix_then_its_own_tokens(backend):
    dense = _dense(backend)
    prefix = _prefix(LAYOUT, seed=1)
    dense.plan("generation", LAYOUT, prefix)
    for layer in range(NUM_LAYERS):
        q, k, v = _qkv(LAYOUT, seed=10 + layer)
        out = dense.run("generation", layer, q, k, v)
        torch.testing.assert_close(out, _expected(LAYOUT, prefix, layer, q, k, v))


def test_plan_once_per_forward_run_in_every_layer(monkeypatch):
    copies = []

    def counting_to_device(tensor, device):
        copies.append(tensor.shape)
        return tensor.to(device)

    monkeypatch.setattr(prefix_module, "to_device", counting_to_device)
    dense = _dense("fa3")
    dense.plan("generation", LAYOUT, _prefix(LAYOUT, seed=2))
    for layer in range(NUM_LAYERS):
        dense.run("generation", layer, *_qkv(LAYOUT, seed=layer))
    ragged = dense.ragged
    assert dense.num_index_copies == 1 and ragged.num_kernel_plans == 1
    assert len(copies) == 1  # the key positions go to the device at plan(), never per layer
    # the next step, same layout, new prefixes (other requests' K/V): no index copy, no kernel plan
    new_prefix = _prefix(LAYOUT, seed=3)
    dense.plan("generation", LAYOUT, new_prefix)
    q, k, v = _qkv(LAYOUT, seed=4)
    torch.testing.assert_close(dense.run("generation", 1, q, k, v), _expected(LAYOUT, new_prefix, 1, q, k, v))
    assert dense.num_index_copies == 1 and ragged.num_kernel_plans == 1
    # another layout: one more of each
    other_prefix = _prefix(OTHER, seed=5)
    dense.plan("generation", OTHER, other_prefix)
    q, k, v = _qkv(OTHER, seed=6)
    torch.testing.assert_close(
        dense.run("generation", 2, q, k, v), _expected(OTHER, other_prefix, 2, q, k, v)
    )
    assert dense.num_index_copies == 2 and ragged.num_kernel_plans == 2


def test_a_failed_plan_leaves_the_label_unplanned():
    flashinfer = FakeFlashInfer()
    dense = _dense("flashinfer", flashinfer, num_slots=1)  # one slot: the next plan reschedules it
    dense.plan("generation", LAYOUT, _prefix(LAYOUT, seed=7))
    dense.run("generation", 0, *_qkv(LAYOUT, seed=8))  # FlashInfer now knows the head shape
    flashinfer.plan_error = RuntimeError("plan failed")
    with pytest.raises(RuntimeError, match="plan failed"):
        dense.plan("generation", OTHER, _prefix(OTHER, seed=9))
    with pytest.raises(RuntimeError, match="no plan"):
        dense.run("generation", 0, *_qkv(OTHER, seed=10))
    flashinfer.plan_error = None
    prefix = _prefix(OTHER, seed=11)
    dense.plan("generation", OTHER, prefix)
    q, k, v = _qkv(OTHER, seed=12)
    torch.testing.assert_close(dense.run("generation", 0, q, k, v), _expected(OTHER, prefix, 0, q, k, v))


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_a_forgotten_plan_is_planned_again(backend):
    """The plan cache's last rule under the dense manager: a wrapper told to forget (a dropped
    pre-plan) plans its next layout again, even the one it held; the output stays right."""
    dense = _dense(backend)
    dense.plan("generation", LAYOUT, _prefix(LAYOUT, seed=30))
    dense.run("generation", 0, *_qkv(LAYOUT, seed=31))
    for wrapper in dense.ragged.wrappers("generation"):
        wrapper.forget()
    prefix = _prefix(LAYOUT, seed=32)
    dense.plan("generation", LAYOUT, prefix)
    assert dense.ragged.num_kernel_plans == 2 and dense.num_index_copies == 1  # the index is the layout's
    q, k, v = _qkv(LAYOUT, seed=33)
    torch.testing.assert_close(dense.run("generation", 1, q, k, v), _expected(LAYOUT, prefix, 1, q, k, v))


def test_release_lets_go_of_the_prefix():
    dense = _dense()
    prefix = _prefix(LAYOUT, seed=13)
    alive = weakref.ref(prefix)
    dense.plan("generation", LAYOUT, prefix)
    dense.run("generation", 0, *_qkv(LAYOUT, seed=14))
    dense.release("generation")
    del prefix
    gc.collect()
    assert alive() is None
    with pytest.raises(RuntimeError, match="released"):
        dense.run("generation", 0, *_qkv(LAYOUT, seed=15))


def test_mismatches_are_errors():
    dense = _dense()
    with pytest.raises(RuntimeError, match="never planned"):
        dense.run("generation", 0, *_qkv(LAYOUT, seed=16))
    with pytest.raises(ValueError, match="prefixes hold"):
        dense.plan("generation", LAYOUT, _prefix(OTHER, seed=17))
    dense.plan("generation", LAYOUT, _prefix(LAYOUT, seed=18))
    with pytest.raises(ValueError, match="tokens"):
        dense.run("generation", 0, *_qkv(OTHER, seed=19))
    with pytest.raises(ValueError, match="segment"):
        PrefixLayout(prefix_lens=(1, 2), q_lens=(3,))
    with pytest.raises(ValueError, match="bad segment"):
        PrefixLayout(prefix_lens=(1,), q_lens=(0,))


def test_one_opaque_op_in_a_compiled_layer_stack():
    dense = _dense()
    prefix = _prefix(LAYOUT, seed=20)
    dense.plan("generation", LAYOUT, prefix)
    q, k, v = _qkv(LAYOUT, seed=21)

    def layers(q, k, v):
        out = q
        for layer in range(NUM_LAYERS):
            out = dense.run("generation", layer, out, k, v)
        return out

    compiled = torch.compile(layers, backend="eager", fullgraph=True)  # no graph break
    torch.testing.assert_close(compiled(q, k, v), layers(q, k, v))
