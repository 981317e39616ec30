"""The KV pool's page bookkeeping: refcounts, the free list, the prefix cache and its LRU eviction."""

import pytest

from mstar.engine.kv.pages import PageTable, prefix_hashes


def test_allocate_and_release_return_every_page():
    pages = PageTable(num_pages=8, page_tokens=4)
    first = pages.allocate(5)
    assert first == [0, 1, 2, 3, 4]
    assert pages.allocate(4) is None  # all or nothing
    assert pages.stats().num_free == 3
    pages.release(first)
    assert pages.stats().num_free == 8 and pages.stats().num_used == 0


def test_release_twice_is_an_error():
    pages = PageTable(4, 4)
    (page,) = pages.allocate(1)
    pages.release([page])
    with pytest.raises(ValueError, match="released more often"):
        pages.release([page])


def test_hash_chains_depend_on_the_whole_prefix():
    a = prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = prefix_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and len(b) == 2  # only full pages
    assert a[1] != b[1]  # same second page, different first page: different keys
    assert prefix_hashes([1, 2, 3, 4], 4) == a[:1]
    assert prefix_hashes([1, 2, 3, 4], 4, namespace="uncond") != a[:1]


def test_cached_pages_are_shared_and_refcounted():
    pages = PageTable(8, 4)
    tokens = list(range(12))
    hashes = prefix_hashes(tokens, 4)
    owned = pages.allocate(3)
    for page, key in zip(owned, hashes, strict=True):
        pages.register_full(page, key)
    matched = pages.match_prefix(hashes[:2])
    assert matched == owned[:2]
    assert pages.refcount(owned[0]) == 2
    pages.release(owned)
    assert pages.stats().num_used == 2  # still held by the second sequence
    pages.release(matched)
    stats = pages.stats()
    assert stats.num_used == 0 and stats.num_cached == 3 and stats.num_free == 5


def test_unreferenced_cached_pages_are_evicted_oldest_first():
    pages = PageTable(4, 2)
    old, new = prefix_hashes([1, 1], 2), prefix_hashes([2, 2], 2)
    for key in (old, new):
        (page,) = pages.allocate(1)
        pages.register_full(page, key[0])
        pages.release([page])
    taken = pages.allocate(3)  # two free pages, then the least recently used cached one
    assert taken is not None and pages.num_evictions == 1
    assert pages.match_prefix(old) == []  # evicted
    assert len(pages.match_prefix(new)) == 1  # kept


def test_a_hit_refreshes_the_lru_order():
    pages = PageTable(3, 2)
    keys = [prefix_hashes([n, n], 2) for n in (1, 2)]
    for key in keys:
        (page,) = pages.allocate(1)
        pages.register_full(page, key[0])
        pages.release([page])
    pages.release(pages.match_prefix(keys[0]))  # key 0 used again: now the most recent
    pages.allocate(2)
    assert pages.match_prefix(keys[0]) != [] and pages.match_prefix(keys[1]) == []


def test_prefix_cache_off_matches_nothing():
    pages = PageTable(4, 2, enable_prefix_cache=False)
    (page,) = pages.allocate(1)
    key = prefix_hashes([5, 5], 2)
    pages.register_full(page, key[0])
    pages.release([page])
    assert pages.match_prefix(key) == [] and pages.stats().num_free == 4


def test_chained_hashes_are_page_hash_page_by_page_and_extend():
    from mstar.engine.kv.pages import chain_hashes, page_hash, root_hash
    from mstar.llm.sequence import Sequence

    tokens = [(i * 7919) % 151_936 for i in range(70)]
    expected, parent = [], root_hash("ns")
    for start in range(0, 64, 16):
        parent = page_hash(parent, tokens[start : start + 16])
        expected.append(parent)
    assert chain_hashes(root_hash("ns"), tokens, 16) == expected == prefix_hashes(tokens, 16, "ns")
    seq = Sequence.new("s", tokens, 0, namespace="ns")
    assert seq.page_hashes(1, 16) == expected[:1] and seq.page_hashes(4, 16) == expected
    assert seq.page_hashes(2, 16) == expected[:2]
