"""Prefixes in the paged KV pool (a DiT's text prefix, Cosmos3's understanding pathway): written once,
found whole by the prefix cache, gathered per layer through row indices copied to the device once per
forward, and nothing held after any failure."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.attention import PrefixAttention, PrefixLayout, StackedPrefixKV, build_attention
from mstar.engine.attention import prefix as attention_prefix
from mstar.engine.kv import prefix as kv_prefix
from mstar.engine.kv.pool import KVGeometry, KVPool
from mstar.engine.kv.prefix import PagedPrefixKV, PoolExhausted, PrefixPages

NUM_LAYERS, KV_HEADS, HEAD_DIM, PAGE_TOKENS = 3, 2, 8, 4
HEADS = 4
A = list(range(10, 20))  # 2 full pages and a partial one
B = [7, 3, 5]  # one partial page


def _pages(num_pages: int = 16, enable_prefix_cache: bool = True) -> PrefixPages:
    geometry = KVGeometry(NUM_LAYERS, KV_HEADS, HEAD_DIM, torch.float32, PAGE_TOKENS)
    return PrefixPages(KVPool(geometry, num_pages, "cpu", enable_prefix_cache), "test.prefix")


def _kv(tokens: list[int]) -> torch.Tensor:
    """[layers, 2, T, Hkv, D], a function of the tokens alone."""
    generator = torch.Generator().manual_seed(sum((i + 1) * t for i, t in enumerate(tokens)))
    return torch.randn(NUM_LAYERS, 2, len(tokens), KV_HEADS, HEAD_DIM, generator=generator)


class Compute:
    """The compute callback of acquire(), counting its calls."""

    def __init__(self):
        self.calls: list[list[int]] = []

    def __call__(self, tokens: list[int]):
        def compute() -> torch.Tensor:
            self.calls.append(tokens)
            return _kv(tokens)

        return compute


def _no_pages_used(cache: PrefixPages) -> bool:
    return cache.num_held == 0 and cache.pool.pages.stats().num_used == 0


def test_prefixes_round_trip_through_their_pages():
    cache, compute = _pages(), Compute()
    held = [cache.acquire(tokens, compute(tokens)) for tokens in (A, B)]
    kv = PagedPrefixKV(cache.pool, held)
    assert kv.prefix_lens == (10, 3) and kv.num_layers == NUM_LAYERS
    for layer in range(NUM_LAYERS):
        keys, values = kv.layer(layer)
        assert torch.equal(keys, torch.cat([_kv(A)[layer, 0], _kv(B)[layer, 0]]))
        assert torch.equal(values, torch.cat([_kv(A)[layer, 1], _kv(B)[layer, 1]]))
    for prefix in held:
        cache.release(prefix)
    assert _no_pages_used(cache)


def test_an_identical_token_list_takes_the_whole_prefix_and_computes_nothing():
    cache, compute = _pages(), Compute()
    first = cache.acquire(A, compute(A))
    again = cache.acquire(list(A), compute(A))
    assert compute.calls == [A] and (again.cached, first.cached) == (True, False)
    assert again.pages == first.pages and (cache.num_hits, cache.num_computed) == (1, 1)
    cache.release(first)
    cache.release(again)
    assert _no_pages_used(cache)
    cache.release(cache.acquire(A, compute(A)))  # released pages stay cached until evicted
    assert len(compute.calls) == 1


@pytest.mark.parametrize("other", [A[:4], A[:8], A + [99, 98]], ids=["first-page", "two-pages", "longer"])
def test_a_token_list_sharing_pages_with_another_is_computed_whole(other):
    """K/V computed as part of a longer or shorter run may differ in the last bits: a prefix that
    is the page-aligned start of another, or one that extends it, reuses none of its pages."""
    cache, compute = _pages(), Compute()
    first = cache.acquire(A, compute(A))
    second = cache.acquire(other, compute(other))
    assert compute.calls == [A, other] and not second.cached
    assert not set(first.pages) & set(second.pages)
    keys, _ = PagedPrefixKV(cache.pool, [second]).layer(1)
    assert torch.equal(keys, _kv(other)[1, 0])


def test_with_the_prefix_cache_off_every_acquire_computes():
    cache, compute = _pages(enable_prefix_cache=False), Compute()
    held = [cache.acquire(A, compute(A)) for _ in range(2)]
    assert len(compute.calls) == 2 and cache.num_hits == 0
    for prefix in held:
        cache.release(prefix)
    assert _no_pages_used(cache)


def test_page_rows_go_to_the_device_once_per_forward_never_per_layer(monkeypatch):
    cache, compute = _pages(), Compute()
    held = [cache.acquire(tokens, compute(tokens)) for tokens in (A, B)]
    copies, slot_builds = [], []
    to_device, slots_of = kv_prefix.to_device, kv_prefix.slots_of
    monkeypatch.setattr(kv_prefix, "to_device", lambda t, d: copies.append(t.shape) or to_device(t, d))
    monkeypatch.setattr(kv_prefix, "slots_of", lambda *a: slot_builds.append(a) or slots_of(*a))
    kv = PagedPrefixKV(cache.pool, held)
    assert (len(copies), len(slot_builds)) == (1, 2)  # one copy for the forward, slots per prefix
    for layer in range(NUM_LAYERS):
        kv.layer(layer)
    assert (len(copies), len(slot_builds)) == (1, 2)


def test_dense_attention_over_pool_prefixes_equals_it_over_stacked_ones(monkeypatch):
    """The generation pathway's attention reading its prefixes from the pool: one index copy and
    one kernel plan for every layer, the same outputs as over plain tensors."""
    cache, compute = _pages(), Compute()
    held = [cache.acquire(tokens, compute(tokens)) for tokens in (A, B)]
    layout = PrefixLayout(prefix_lens=(10, 3), q_lens=(6, 5))
    dense = PrefixAttention(build_attention("torch", "cpu", torch.float32))
    stacked = StackedPrefixKV([_kv(A), _kv(B)])
    generator = torch.Generator().manual_seed(0)
    qkv = [
        (torch.randn(11, HEADS, HEAD_DIM, generator=generator),
         torch.randn(11, KV_HEADS, HEAD_DIM, generator=generator),
         torch.randn(11, KV_HEADS, HEAD_DIM, generator=generator))
        for _ in range(NUM_LAYERS)
    ]  # fmt: skip
    index_copies = []
    original = attention_prefix.to_device
    monkeypatch.setattr(attention_prefix, "to_device", lambda t, d: index_copies.append(1) or original(t, d))
    outputs = {}
    for name, prefix in (("pool", PagedPrefixKV(cache.pool, held)), ("stacked", stacked)):
        dense.plan("generation", layout, prefix)
        outputs[name] = [dense.run("generation", layer, *qkv[layer]) for layer in range(NUM_LAYERS)]
        dense.release("generation")
    assert all(torch.equal(a, b) for a, b in zip(outputs["pool"], outputs["stacked"], strict=True))
    assert len(index_copies) == 1 and dense.num_index_copies == 1 and dense.ragged.num_kernel_plans == 1


def test_failures_hold_nothing():
    cache, compute = _pages(num_pages=4), Compute()

    def failing() -> torch.Tensor:
        raise RuntimeError("understanding failed")

    with pytest.raises(RuntimeError, match="understanding failed"):
        cache.acquire(A, failing)
    assert _no_pages_used(cache)
    with pytest.raises(ValueError, match="the pool takes"):
        cache.acquire(A, lambda: _kv(A)[:, :, :5])  # K/V of the wrong length
    assert _no_pages_used(cache)
    held = cache.acquire(A, compute(A))  # 3 of the 4 pages
    with pytest.raises(PoolExhausted, match="no room for a 11-token prefix"):
        cache.acquire(A + [1], compute(A + [1]))
    assert cache.num_held == 1 and cache.pool.pages.stats().num_used == 3
    cache.release(held)
    assert _no_pages_used(cache)
    with pytest.raises(ValueError, match="at least one token"):
        cache.acquire([], compute([]))
