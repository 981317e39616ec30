"""Prefixes computed once and kept in the paged KV pool: a DiT's text prefix (its keys and values
per layer) read by every denoise step of the request, shared between requests by the prefix cache.

    cache = PrefixPages(pool, namespace="cosmos3.understanding")
    held = cache.acquire(token_ids, compute=lambda: model.understand(token_ids))   # [L, 2, T, Hkv, D]
    kv = PagedPrefixKV(pool, [held_a, held_b])    # one step: the packed prefixes of its items
    keys, values = kv.layer(3)                    # [sum(T_i), Hkv, D] gathered from the pages
    cache.release(held)                           # the request finished, failed or was cancelled

A prefix's pages are keyed by the chained hash of its tokens (engine.kv.pages): every page but the
last by the page chain, the last one (full or partial) by the chain and its tokens under a terminal
mark, so a repeated token list finds all of its pages and runs nothing, and a token list that is
the page-aligned start of a longer one finds none of the longer one's pages. A prefix is taken whole
or computed whole: K/V computed as part of a longer (or shorter) run can differ in the last bits
(kernels pick by row count), so reusing part of one would make a request's output depend on what
ran before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mstar.engine.kv.pages import page_hash, prefix_hashes, root_hash
from mstar.engine.kv.pool import KVPool
from mstar.engine.transfer import to_device

TAIL_MARK = (-1,)  # chained before a prefix's last page: its key is never a page's inside a prefix


class PoolExhausted(RuntimeError):
    """The pool cannot hold a prefix now (every page is held by running requests)."""


@dataclass(frozen=True)
class HeldPrefix:
    """One prefix's pages (in token order) and its token count; refcounted in the pool."""

    pages: tuple[int, ...]
    num_tokens: int
    cached: bool  # found whole in the prefix cache (nothing was computed)


def prefix_keys(tokens: Sequence[int], page_tokens: int, namespace: str) -> list[bytes]:
    """The key of every page of `tokens`: the chain of the pages before the last, then the last
    page's (full or partial) under the terminal mark."""
    num_before_last = (len(tokens) - 1) // page_tokens * page_tokens
    keys = prefix_hashes(tokens[:num_before_last], page_tokens, namespace)
    parent = keys[-1] if keys else root_hash(namespace)
    keys.append(page_hash(page_hash(parent, TAIL_MARK), tokens[num_before_last:]))
    return keys


class PrefixPages:
    """Acquire and release prefixes in one pool, in one namespace (a model's pathway)."""

    def __init__(self, pool: KVPool, namespace: str):
        self.pool = pool
        self.namespace = namespace
        self.num_hits = 0  # prefixes found whole in the cache
        self.num_computed = 0  # prefixes computed and written
        self.num_held = 0  # prefixes acquired and not yet released

    def acquire(self, tokens: Sequence[int], compute: Callable[[], torch.Tensor]) -> HeldPrefix:
        """The prefix of `tokens`, from the cache or `compute()` ([layers, 2, T, Hkv, D]) written
        into fresh pages. PoolExhausted (nothing held) when the pool cannot take it."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("a prefix needs at least one token")
        pages = self.pool.pages
        keys = prefix_keys(tokens, self.pool.page_tokens, self.namespace)
        matched = pages.match_prefix(keys)
        if len(matched) == len(keys):
            self.num_hits += 1
            self.num_held += 1
            return HeldPrefix(tuple(matched), len(tokens), cached=True)
        pages.release(matched)  # taken whole or computed whole (see the module docstring)
        fresh = pages.allocate(len(keys))
        if fresh is None:
            raise PoolExhausted(
                f"KV pool: no room for a {len(tokens)}-token prefix ({len(keys)} pages; "
                f"{pages.num_available()} of {pages.num_pages} available)"
            )
        try:
            self._write(fresh, compute(), len(tokens))
        except BaseException:
            pages.release(fresh)
            raise
        for page, key in zip(fresh, keys, strict=True):
            pages.register_full(page, key)
        self.num_computed += 1
        self.num_held += 1
        return HeldPrefix(tuple(fresh), len(tokens), cached=False)

    def release(self, held: HeldPrefix) -> None:
        self.pool.pages.release(held.pages)
        self.num_held -= 1

    def _write(self, pages: list[int], kv: torch.Tensor, num_tokens: int) -> None:
        geometry = self.pool.geometry
        expected = (geometry.num_layers, 2, num_tokens, geometry.num_kv_heads, geometry.head_dim)
        if tuple(kv.shape) != expected:
            raise ValueError(f"prefix K/V are {tuple(kv.shape)}, the pool takes {expected}")
        rows = self.pool.key_rows(
            to_device(slots_of(pages, num_tokens, self.pool.page_tokens), self.pool.device)
        )
        kv = kv.to(self.pool.device)
        for layer in range(geometry.num_layers):
            self.pool.write(layer, rows, kv[layer, 0], kv[layer, 1])


def slots_of(pages: Sequence[int], num_tokens: int, page_tokens: int) -> torch.Tensor:
    """int64 [num_tokens]: the pool slot (page * page_tokens + offset) of each token, in order."""
    offsets = torch.arange(num_tokens, dtype=torch.int64)
    table = torch.tensor(pages, dtype=torch.int64)
    return table[offsets // page_tokens] * page_tokens + offsets % page_tokens


class PagedPrefixKV:
    """The prefixes of one forward's segments read from the pool (mstar.engine.attention.PrefixKV):
    their key rows built on the host and copied to the device once, here; every layer gathers."""

    def __init__(self, pool: KVPool, prefixes: Sequence[HeldPrefix]):
        if not prefixes:
            raise ValueError("PagedPrefixKV needs at least one prefix")
        self.pool = pool
        self.prefix_lens = tuple(held.num_tokens for held in prefixes)
        slots = torch.cat([slots_of(h.pages, h.num_tokens, pool.page_tokens) for h in prefixes])
        self.key_rows = to_device(pool.key_rows(slots), pool.device)  # the one host-to-device copy

    @property
    def num_layers(self) -> int:
        return self.pool.geometry.num_layers

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.gather(index, self.key_rows)
