"""PagedLayout: the host description of one step's attention over the KV pool. No torch.

A step packs segments one after another. Segment i brings q_lens[i] new tokens (queries, and the
keys/values written to the pool this step) at positions kv_lens[i] - q_lens[i] .. kv_lens[i] - 1
of its sequence, and attends over all kv_lens[i] tokens it has in the pool, which live in its pages
page_ids[i] (ceil(kv_len / page_tokens) of them, in order). Causal: a new token sees the tokens
before it and itself. The first `num_decode` segments are decode rows (one new token each), so a
backend can run them with a decode kernel and the rest with a prefill kernel.

    layout = PagedLayout.build(q_lens=[1, 1, 37], kv_lens=[90, 12, 37], page_ids=[[4, 9, ...], ...], page_tokens=16)
    layout.qo_indptr, layout.kv_page_indptr, layout.kv_page_indices, layout.kv_last_page_lens  # FlashInfer's page table
    layout.write_slots   # pool slot (page * page_tokens + offset) of every new token, in pack order
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate, chain

import numpy as np


@dataclass(frozen=True, eq=False)
class PagedLayout:
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    page_ids: tuple[tuple[int, ...], ...]
    page_tokens: int
    num_decode: int = 0
    causal: bool = True
    _key: tuple = field(default=(), repr=False)

    @classmethod
    def build(
        cls,
        q_lens: Sequence[int],
        kv_lens: Sequence[int],
        page_ids: Sequence[Sequence[int]],
        page_tokens: int,
        num_decode: int | None = None,
        causal: bool = True,
    ) -> PagedLayout:
        """Checks the shapes once; num_decode None counts the leading one-token segments."""
        q_lens, kv_lens = tuple(int(n) for n in q_lens), tuple(int(n) for n in kv_lens)
        # built every step over every page of every row: tuple() runs in C (and returns a tuple as is)
        pages = tuple(map(tuple, page_ids))
        if not (len(q_lens) == len(kv_lens) == len(pages)) or not q_lens:
            raise ValueError(
                f"paged layout: {len(q_lens)} q lens, {len(kv_lens)} kv lens, {len(pages)} page lists"
            )
        for index, (q_len, kv_len, ids) in enumerate(zip(q_lens, kv_lens, pages, strict=True)):
            if not 1 <= q_len <= kv_len:
                raise ValueError(f"paged layout segment {index}: q_len {q_len} with kv_len {kv_len}")
            if len(ids) != -(-kv_len // page_tokens):
                raise ValueError(
                    f"paged layout segment {index}: {kv_len} tokens need {-(-kv_len // page_tokens)} "
                    f"pages of {page_tokens}, got {len(ids)}"
                )
        if num_decode is None:
            num_decode = next((i for i, n in enumerate(q_lens) if n != 1), len(q_lens))
        if any(n != 1 for n in q_lens[:num_decode]):
            raise ValueError("paged layout: decode segments must come first, with one token each")
        key = (q_lens, kv_lens, pages, page_tokens, num_decode, causal)
        return cls(q_lens, kv_lens, pages, page_tokens, num_decode, causal, key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PagedLayout) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    # ---- sizes -----------------------------------------------------------------------------

    @property
    def num_segments(self) -> int:
        return len(self.q_lens)

    @property
    def num_prefill(self) -> int:
        return self.num_segments - self.num_decode

    @cached_property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @cached_property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens)

    # ---- page table (FlashInfer's layout; int32) ---------------------------------------------

    @cached_property
    def qo_indptr(self) -> np.ndarray:
        return _indptr(self.q_lens)

    @cached_property
    def kv_page_indptr(self) -> np.ndarray:
        return _indptr([len(ids) for ids in self.page_ids])

    @cached_property
    def kv_page_indices(self) -> np.ndarray:
        # one C loop over every entry (a prefix-cache hit's tail rows repeat the prefix's pages)
        return np.fromiter(chain.from_iterable(self.page_ids), dtype=np.int32, count=self.num_page_indices)

    @cached_property
    def kv_last_page_lens(self) -> np.ndarray:
        """Tokens in each segment's last page, 1..page_tokens."""
        kv = np.asarray(self.kv_lens, dtype=np.int32)
        return (kv - 1) % self.page_tokens + 1

    @cached_property
    def kv_indptr(self) -> np.ndarray:
        """Token offsets of each segment's keys once gathered into one contiguous buffer."""
        return _indptr(self.kv_lens)

    # ---- slots -------------------------------------------------------------------------------

    @cached_property
    def write_slots(self) -> np.ndarray:
        """int64 [total_q]: the pool slot (page * page_tokens + offset) of every new token."""
        positions = self.new_positions
        segment = np.repeat(np.arange(self.num_segments), self.q_lens)
        return self._slots(segment, positions)

    @cached_property
    def new_positions(self) -> np.ndarray:
        """int64 [total_q]: the position in its sequence of every new token (rotary embeddings)."""
        q = np.asarray(self.q_lens, dtype=np.int64)
        # token t of segment i is at kv_lens[i] - q_lens[i] + (t - qo_indptr[i])
        offsets = np.asarray(self.kv_lens, dtype=np.int64) - q - self.qo_indptr[:-1]
        return np.arange(self.total_q, dtype=np.int64) + np.repeat(offsets, q)

    @cached_property
    def gather_slots(self) -> np.ndarray:
        """int64 [total_kv]: the pool slot of every token each segment attends over, segment after
        segment (to gather keys and values into one contiguous buffer)."""
        kv = np.asarray(self.kv_lens, dtype=np.int64)
        segment = np.repeat(np.arange(self.num_segments), kv)
        positions = np.arange(self.total_kv, dtype=np.int64) - np.repeat(_indptr(self.kv_lens)[:-1], kv)
        return self._slots(segment, positions)

    def _slots(self, segment: np.ndarray, positions: np.ndarray) -> np.ndarray:
        page_starts = self.kv_page_indptr[:-1].astype(np.int64)
        flat_page = page_starts[segment] + positions // self.page_tokens
        pages = self.kv_page_indices.astype(np.int64)[flat_page]
        return pages * self.page_tokens + positions % self.page_tokens

    # ---- parts -------------------------------------------------------------------------------

    def as_decode_rows(self) -> PagedLayout:
        """Every new token as a decode row of its own, over its sequence's pages up to itself: the
        same causal attention, the same pack order, slots and positions, in the shape a decode
        kernel (and a decode CUDA graph) runs. A row per token reads its whole context, so this
        pays where a step has few new tokens (a prompt's tail after a prefix-cache hit)."""
        if not self.causal:
            raise ValueError("paged layout: only a causal layout runs as decode rows")
        tokens = self.page_tokens
        kv_lens: list[int] = []
        page_ids: list[tuple[int, ...]] = []
        counts: list[int] = []
        indices: list[np.ndarray] = []  # the page table, gathered from each segment's pages at once
        slots: list[np.ndarray] = []
        for q_len, kv_len, ids in zip(self.q_lens, self.kv_lens, self.page_ids, strict=True):
            row_ends = np.arange(kv_len - q_len + 1, kv_len + 1)  # int64: each row's kv_len
            row_counts = (row_ends + (tokens - 1)) // tokens  # pages of each row
            pages = np.asarray(ids, dtype=np.int32)
            kv_lens += row_ends.tolist()
            counts += (row_counts_list := row_counts.tolist())
            page_ids += [ids[:count] for count in row_counts_list]
            indices.append(pages[_concatenated_ranges(row_counts)])
            last = row_ends - 1  # the row's own token: its position, and where it is written
            slots.append(pages[last // tokens].astype(np.int64) * tokens + last % tokens)
        rows = PagedLayout.build([1] * len(kv_lens), kv_lens, page_ids, tokens, len(kv_lens))
        # the arrays the rows would build entry by entry, known here at once from each segment's
        # pages (a prefix-cache hit's tail repeats the prefix's pages in every row)
        positions = np.asarray(kv_lens, dtype=np.int64) - 1
        return rows._with_arrays(
            kv_page_indices=np.concatenate(indices),
            kv_page_indptr=_indptr(counts),
            kv_last_page_lens=(positions % tokens + 1).astype(np.int32),
            write_slots=np.concatenate(slots),
            new_positions=positions,
        )

    def with_scratch_rows(self, count: int, scratch_page: int) -> PagedLayout:
        """This decode layout and `count` more decode rows of one token each on `scratch_page`,
        its arrays extended from this layout's (a padded CUDA-graph step builds none again)."""
        tokens = self.page_tokens
        padded = PagedLayout.build(
            self.q_lens + (1,) * count, self.kv_lens + (1,) * count,
            self.page_ids + ((scratch_page,),) * count, tokens, self.num_decode + count, self.causal,
        )  # fmt: skip
        indptr = self.kv_page_indptr
        return padded._with_arrays(
            kv_page_indices=np.concatenate([self.kv_page_indices, np.full(count, scratch_page, np.int32)]),
            kv_page_indptr=np.concatenate([indptr, indptr[-1] + np.arange(1, count + 1, dtype=np.int32)]),
            kv_last_page_lens=np.concatenate([self.kv_last_page_lens, np.ones(count, np.int32)]),
            write_slots=np.concatenate([self.write_slots, np.full(count, scratch_page * tokens, np.int64)]),
        )

    def with_page_indices(self, indices: np.ndarray) -> PagedLayout:
        """This layout with its flat page table already known (int32, every row's pages in order:
        what kv_page_indices would build entry by entry); returns self."""
        return self._with_arrays(kv_page_indices=indices)

    def _with_arrays(self, **arrays: np.ndarray) -> PagedLayout:
        """Set cached arrays known to equal what their properties would build; returns self."""
        self.__dict__.update(arrays)  # the cached_properties' slots (the frozen fields stay)
        return self

    @property
    def num_page_indices(self) -> int:
        """Entries of the page table (a page read by several segments counts once for each)."""
        return sum(len(ids) for ids in self.page_ids)

    def part(self, start: int, stop: int) -> PagedLayout | None:
        """Segments start..stop-1 as a layout of their own (None when empty)."""
        if start >= stop:
            return None
        if start == 0 and stop >= self.num_segments:
            return self  # immutable: the whole layout, its arrays already built
        decode = max(0, min(self.num_decode, stop) - start)
        return PagedLayout.build(
            self.q_lens[start:stop],
            self.kv_lens[start:stop],
            self.page_ids[start:stop],
            self.page_tokens,
            decode,
            self.causal,
        )


def _concatenated_ranges(counts: np.ndarray) -> np.ndarray:
    """0..counts[0]-1, then 0..counts[1]-1, ... as one int64 array."""
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(int(counts.sum()), dtype=np.int64) - starts


def _indptr(lengths: Sequence[int]) -> np.ndarray:
    """int32 [len + 1]: 0, then the running sums (one C loop; np.cumsum into a slice of zeros
    costs several times more for the few segments of a step)."""
    return np.fromiter(accumulate(lengths, initial=0), dtype=np.int32, count=len(lengths) + 1)
