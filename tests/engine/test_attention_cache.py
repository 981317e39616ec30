"""The plan cache, slots and pre-plans, with fake fa3 and FlashInfer kernels that record calls."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.attention import AttentionLayout, DeviceLayout, build_attention, reference_attention
from tests.engine.attention_fakes import HOPPER, FakeFA3, FakeFlashInfer, random_qkv

L1 = AttentionLayout.self_attention((5, 9))
L2 = AttentionLayout.self_attention((4, 4, 7))
CROSS = AttentionLayout.cross_attention((5, 9), (3, 2))


def build(backend: str, cuda_graph: bool = False, flashinfer: FakeFlashInfer | None = None):
    fa3, flashinfer = FakeFA3(), flashinfer or FakeFlashInfer()
    attention = build_attention(
        backend,
        "cpu",
        torch.float32,
        workspace_mb=1,
        cuda_graph=cuda_graph,
        libraries={"fa3": fa3, "flashinfer": flashinfer},
        platform=HOPPER,
    )
    return attention, fa3, flashinfer


def kernel_plans(attention, label: str) -> int:
    return sum(wrapper.num_kernel_plans for wrapper in attention.wrappers(label))


def run_and_check(attention, label: str, layout: AttentionLayout, seed: int = 0) -> torch.Tensor:
    q, k, v = random_qkv(layout, seed=seed)
    out = attention.run(label, q, k, v)
    torch.testing.assert_close(out, reference_attention(q, k, v, layout))
    return out


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_same_layout_reuses_the_plan(backend):
    attention, _, flashinfer = build(backend)
    attention.plan("self", L1)
    run_and_check(attention, "self", L1)
    fake_plans = len(flashinfer.plan_calls)
    attention.plan("self", L1)
    run_and_check(attention, "self", L1)
    assert kernel_plans(attention, "self") == 1
    assert len(flashinfer.plan_calls) == fake_plans


def test_offsets_are_staged_once_per_plan_not_per_layer():
    attention, fa3, _ = build("fa3")
    attention.plan("self", L1)
    fa3.calls.clear()
    for _ in range(4):  # four layers
        run_and_check(attention, "self", L1)
    wrapper = attention.wrappers("self")[attention.active_slot("self")]
    assert wrapper.stager.num_copies == 1
    assert len({call["cu_q"].data_ptr() for call in fa3.calls}) == 1
    assert fa3.calls[0]["cu_q"].tolist() == [0, 5, 14]
    assert fa3.calls[0]["max_q"] == 9


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_new_layout_is_a_miss(backend):
    attention, _, _ = build(backend)
    attention.plan("self", L1)
    attention.plan("self", L2)
    assert kernel_plans(attention, "self") == 2
    run_and_check(attention, "self", L2)


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_each_slot_owns_its_schedule(backend):
    attention, _, _ = build(backend)
    attention.plan("self", L1)
    run_and_check(attention, "self", L1)
    attention.plan("self", L2)
    assert attention.active_slot("self") == 1
    run_and_check(attention, "self", L2)
    attention.plan("self", L1)  # still held by slot 0: no work, slot 0 runs again
    assert attention.active_slot("self") == 0
    run_and_check(attention, "self", L1)
    attention.plan("self", L2)
    run_and_check(attention, "self", L2)
    assert kernel_plans(attention, "self") == 2


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_cross_attention_has_its_own_cache(backend):
    attention, _, _ = build(backend)
    for _ in range(3):  # three steps of one DiT forward
        attention.plan("self", L1)
        attention.plan("cross", CROSS)
        run_and_check(attention, "self", L1)
        run_and_check(attention, "cross", CROSS)
    assert kernel_plans(attention, "self") == 1
    assert kernel_plans(attention, "cross") == 1


def test_causal_is_part_of_the_key():
    attention, fa3, _ = build("fa3")
    causal = AttentionLayout.self_attention(L1.q_lens, causal=True)
    attention.plan("self", L1)
    attention.plan("self", causal)
    assert kernel_plans(attention, "self") == 2
    fa3.calls.clear()
    run_and_check(attention, "self", causal)
    assert fa3.calls[0]["causal"] is True


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
def test_device_layout_always_plans(backend):
    attention, _, _ = build(backend)
    device_layout = DeviceLayout(
        torch.tensor([0, 5, 14], dtype=torch.int32),
        torch.tensor([0, 5, 14], dtype=torch.int32),
        max_q_len=9,
        max_kv_len=9,
        total_q=14,
        total_kv=14,
    )
    for _ in range(3):  # more plans than slots: a remembered device layout would be reused
        attention.plan("self", device_layout)
    assert kernel_plans(attention, "self") == 3
    assert attention.wrappers("self")[0].plan(device_layout) is True
    run_and_check(attention, "self", L1)
    attention.plan("self", L1)  # same content as a host layout: nothing remembered to compare with
    assert kernel_plans(attention, "self") == 5


def test_captured_wrapper_keeps_its_buffers():
    attention, _, flashinfer = build("flashinfer", cuda_graph=True)
    wrapper = attention.wrappers("self")[0]
    q, k, v = random_qkv(L1)
    wrapper.plan(L1)
    wrapper.run(q, k, v)
    buffer_address = wrapper.stager.device_buffer.data_ptr()
    other = AttentionLayout.self_attention((8, 6))  # same segment count, other lengths
    wrapper.plan(other)
    out = wrapper.run(*random_qkv(other)[:3])
    assert wrapper.stager.device_buffer.data_ptr() == buffer_address
    inner = flashinfer.wrappers[-1]
    assert inner.use_cuda_graph and inner.qo_indptr_buf.data_ptr() == buffer_address
    assert inner.qo_indptr_buf.tolist() == [0, 8, 14]
    assert out.shape == (14, 2, 8)
    with pytest.raises(ValueError, match="captured"):
        wrapper.plan(L2)  # three segments: a graph captured for two cannot run it


def test_eager_wrapper_grows_its_buffers():
    attention, _, flashinfer = build("fa3")
    wrapper = attention.wrappers("self")[0]
    wrapper.plan(L1)
    many = AttentionLayout.self_attention(tuple(range(1, 20)))
    wrapper.plan(many)
    assert wrapper.stager.device_buffer.numel() >= 2 * 20
    assert not wrapper.captured
    assert wrapper.stager.host_buffer.is_pinned() is False  # pinned only for CUDA


def test_plan_that_raises_leaves_nothing_to_reuse():
    flashinfer = FakeFlashInfer()
    attention, _, _ = build("flashinfer", flashinfer=flashinfer)
    attention.plan("self", L1)
    run_and_check(attention, "self", L1)  # the wrapper learns the head shape: later plans schedule at once
    attention.plan("self", L2)
    run_and_check(attention, "self", L2)
    flashinfer.plan_error = RuntimeError("planner failed")
    with pytest.raises(RuntimeError, match="planner failed"):
        attention.plan("self", AttentionLayout.self_attention((7, 7)))  # into slot 0, which held L1
    with pytest.raises(RuntimeError, match="no plan"):
        run_and_check(attention, "self", L1)
    flashinfer.plan_error = None
    calls = len(flashinfer.plan_calls)
    attention.plan("self", L1)
    assert len(flashinfer.plan_calls) == calls + 1
    run_and_check(attention, "self", L1)


def test_plan_that_raises_on_a_held_layout_forgets_it():
    attention, _, _ = build("fa3", cuda_graph=True)
    wrapper = attention.wrappers("self")[0]
    wrapper.plan(L1)
    with pytest.raises(ValueError):
        wrapper.plan(L2)  # raises inside the kernel plan
    assert wrapper.planned_layout is None
    assert wrapper.plan(L1) is True  # does the work again


def test_run_before_plan_names_the_label():
    attention, _, _ = build("fa3")
    with pytest.raises(RuntimeError, match="'self' was never planned"):
        attention.run("self", *random_qkv(L1))


def test_run_checks_token_counts():
    attention, _, _ = build("fa3")
    attention.plan("self", L1)
    with pytest.raises(ValueError, match="layout has 14"):
        attention.run("self", *random_qkv(L2))


def test_first_plan_under_inference_mode_then_outside():
    attention, _, _ = build("fa3")
    with torch.inference_mode():
        attention.plan("self", L1)
        run_and_check(attention, "self", L1)
    for slot_layout in (L2, AttentionLayout.self_attention((6, 6))):  # the ring comes back to slot 0
        attention.plan("self", slot_layout)
        run_and_check(attention, "self", slot_layout)
