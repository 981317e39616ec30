"""Page bookkeeping of the KV pool: refcounted pages and the prefix cache. Pure Python, no torch.

A page holds `page_tokens` consecutive tokens of one sequence (every layer's keys and values for
them live at that page index in the pool's tensors). A page is in one of three states:
- free: on the free list, holds nothing anyone can find;
- used: refcount > 0 (one or more sequences read it; only its first owner ever wrote it);
- cached: refcount 0 but registered in the prefix cache under the hash of its tokens and of every
  token before it, so a later sequence with the same prefix takes it back instead of recomputing.
  Cached pages are evicted least recently used first when the free list runs dry.

    pages = PageTable(num_pages=1024, page_tokens=16)
    matched = pages.match_prefix(token_ids)          # cached full pages of the prefix (refcounted)
    new = pages.allocate(3)                          # None when not even eviction frees enough
    pages.register_full(hashes_so_far, page, tokens) # a page just filled: findable from now on
    pages.release(all_pages_of_the_sequence)         # finish, abort, preemption: refcounts drop
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROOT_HASH = b"mstar-kv-root"
HASH_BYTES = 16
TOKEN_TYPECODE = "q"  # a token id packed as 8 bytes for hashing


def page_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a full page: its tokens chained with the hash of the prefix before it (blake2b,
    128 bits: a collision would silently serve another prompt's keys, so no 64-bit hash)."""
    return _chained(parent, _packed(tokens))


def _packed(tokens: Sequence[int]) -> bytes:
    return array(TOKEN_TYPECODE, tokens).tobytes()


def _chained(parent: bytes, packed_tokens: bytes) -> bytes:
    return hashlib.blake2b(parent + packed_tokens, digest_size=HASH_BYTES).digest()


def root_hash(namespace: str = "") -> bytes:
    """The parent of a sequence's first page. Sequences share pages only within one namespace
    (a model's LLM pathway, a DiT's text prefix of one label, an adapter)."""
    return ROOT_HASH if not namespace else page_hash(ROOT_HASH + namespace.encode(), ())


def prefix_hashes(tokens: Sequence[int], page_tokens: int, namespace: str = "") -> list[bytes]:
    """The hash of every full page of `tokens`, first to last."""
    return chain_hashes(root_hash(namespace), tokens, page_tokens)


def chain_hashes(parent: bytes, tokens: Sequence[int], page_tokens: int) -> list[bytes]:
    """page_hash of every full page of `tokens`, each chained to the one before (the first to
    `parent`); the tokens are packed once, not page by page (a 2k-token prompt has 128 pages)."""
    packed = _packed(tokens)
    page_bytes = array(TOKEN_TYPECODE).itemsize * page_tokens
    hashes: list[bytes] = []
    for start in range(0, (len(tokens) // page_tokens) * page_bytes, page_bytes):
        parent = _chained(parent, packed[start : start + page_bytes])
        hashes.append(parent)
    return hashes


@dataclass
class PageStats:
    num_pages: int
    num_free: int  # on the free list
    num_cached: int  # refcount 0, findable by the prefix cache (evictable)
    num_used: int  # refcount > 0

    @property
    def usage(self) -> float:
        """Share of pages that requests hold (cached pages can be taken back at any time)."""
        return self.num_used / self.num_pages if self.num_pages else 0.0


class PageTable:
    """Refcounts, the free list and the prefix cache of one pool."""

    def __init__(self, num_pages: int, page_tokens: int, enable_prefix_cache: bool = True):
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"a KV pool needs pages and tokens per page, got {num_pages} x {page_tokens}")
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self.enable_prefix_cache = enable_prefix_cache
        self._refcounts = [0] * num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._by_hash: dict[bytes, int] = {}
        self._hash_of: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, refcount 0, oldest first
        self.num_evictions = 0

    # ---- allocation ------------------------------------------------------------------------

    def num_available(self) -> int:
        """Pages an allocation can take now: free ones plus cached ones it would evict."""
        return len(self._free) + len(self._evictable)

    def allocate(self, count: int) -> list[int] | None:
        """`count` fresh pages (refcount 1 each), evicting the least recently used cached pages
        when the free list is short; None, and nothing taken, when there are not enough."""
        if count > self.num_available():
            return None
        pages = []
        for _ in range(count):
            page = self._free.pop() if self._free else self._evict_oldest()
            self._refcounts[page] = 1
            pages.append(page)
        return pages

    def _evict_oldest(self) -> int:
        page, _ = self._evictable.popitem(last=False)
        del self._by_hash[self._hash_of.pop(page)]
        self.num_evictions += 1
        return page

    def release(self, pages: Iterable[int]) -> None:
        """Drop one reference to each page (a sequence ended, was preempted or aborted)."""
        for page in pages:
            count = self._refcounts[page]
            if count <= 0:
                raise ValueError(f"KV page {page} released more often than it was taken")
            self._refcounts[page] = count - 1
            if count > 1:
                continue
            if page in self._hash_of:
                self._evictable[page] = None  # most recently used last
            else:
                self._free.append(page)

    def refcount(self, page: int) -> int:
        return self._refcounts[page]

    # ---- prefix cache ----------------------------------------------------------------------

    def match_prefix(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached pages of the longest prefix of `hashes` (a page hash chain), each taken
        (refcount + 1); [] when prefix caching is off."""
        if not self.enable_prefix_cache:
            return []
        pages: list[int] = []
        for key in hashes:
            page = self._by_hash.get(key)
            if page is None:
                break
            pages.append(page)
        for page in pages:
            if self._refcounts[page] == 0:
                self._evictable.pop(page, None)
            self._refcounts[page] += 1
        return pages

    def register_full(self, page: int, key: bytes) -> None:
        """`page` now holds a whole page of tokens whose chained hash is `key`: later sequences
        with that prefix find it. A key already cached under another page keeps that page."""
        if not self.enable_prefix_cache or key in self._by_hash or page in self._hash_of:
            return
        self._by_hash[key] = page
        self._hash_of[page] = key

    def clear_cache(self) -> None:
        """Forget every cached page (their refcounts stay); unreferenced ones become free."""
        for page in list(self._evictable):
            self._free.append(page)
        self._evictable.clear()
        self._by_hash.clear()
        self._hash_of.clear()

    # ---- introspection ---------------------------------------------------------------------

    def stats(self) -> PageStats:
        num_free, num_cached = len(self._free), len(self._evictable)
        return PageStats(self.num_pages, num_free, num_cached, self.num_pages - num_free - num_cached)

    def pages_for(self, num_tokens: int) -> int:
        """Pages that hold `num_tokens` tokens."""
        return -(-num_tokens // self.page_tokens)
