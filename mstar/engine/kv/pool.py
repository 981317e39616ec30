"""The paged KV pool: one tensor of keys and values for every layer, cut into pages.

Model-agnostic: a pool knows layers, kv heads, head dim, dtype and device, nothing of requests.
An LLM node keeps its sequences' keys there; a DiT node can keep a text prefix there and gather
it per step (`gather`). Storage is [layers, pages, 2, page_tokens, kv_heads, head_dim] (FlashInfer's
NHD page layout per layer: `pool.layer(i)` is that layer's [pages, 2, page_tokens, kv_heads,
head_dim], keys at [:, 0], values at [:, 1]). Bookkeeping (refcounts, prefix cache) is `pool.pages`;
one scratch page beyond them (`pool.scratch_page`) takes the writes of padding rows.

Sized at boot from the memory left once the weights and the shared workspace are allocated:
`kv_pool_pages` when the config names a count, else `kv_cache_memory_fraction` of the free device
memory (host memory on CPU), capped at what the server can ever use. The sizing is logged.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from mstar.engine.kv.pages import PageTable

log = logging.getLogger("mstar.engine.kv")
GIB = 1024**3


@dataclass(frozen=True)
class KVGeometry:
    """What one token costs in the pool, per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    page_tokens: int = 16

    @property
    def token_bytes(self) -> int:
        """Keys and values of one token over every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _itemsize(self.dtype)

    @property
    def page_bytes(self) -> int:
        return self.token_bytes * self.page_tokens

    def describe(self) -> str:
        return (
            f"{self.num_layers} layers x {self.num_kv_heads} kv heads x {self.head_dim}, "
            f"{str(self.dtype).removeprefix('torch.')}"
        )


@dataclass(frozen=True)
class PoolSizing:
    num_pages: int
    reason: str  # how the count was chosen, for the boot log


class KVPool:
    def __init__(
        self,
        geometry: KVGeometry,
        num_pages: int,
        device: torch.device | str,
        enable_prefix_cache: bool = True,
    ):
        self.geometry = geometry
        self.device = torch.device(device)
        self.page_tokens = geometry.page_tokens
        self.num_pages = num_pages
        self.scratch_page = num_pages  # one page more, never handed out: padding rows write here
        shape = (
            geometry.num_layers,
            num_pages + 1,
            2,
            geometry.page_tokens,
            geometry.num_kv_heads,
            geometry.head_dim,
        )
        # zeros, not empty: attention over a page's unwritten tail must not meet NaNs (0 * NaN)
        with torch.inference_mode(False):
            self.cache = torch.zeros(shape, dtype=geometry.dtype, device=self.device)
        self.pages = PageTable(num_pages, geometry.page_tokens, enable_prefix_cache)

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.page_tokens

    @property
    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size()

    def layer(self, index: int) -> torch.Tensor:
        """[pages, 2, page_tokens, kv_heads, head_dim] of layer `index` (a view)."""
        return self.cache[index]

    def rows(self, index: int) -> torch.Tensor:
        """Layer `index` as [pages * 2 * page_tokens, kv_heads, head_dim]: keys of slot s at row
        key_rows(s), values at key_rows(s) + page_tokens."""
        return self.cache[index].view(-1, self.geometry.num_kv_heads, self.geometry.head_dim)

    def key_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Rows (see `rows`) of the keys of pool slots (page * page_tokens + offset)."""
        tokens = self.page_tokens
        return (slots // tokens) * (2 * tokens) + slots % tokens

    def write(self, layer: int, key_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [N, kv_heads, head_dim] at the slots whose key rows are `key_rows` [N]."""
        rows = self.rows(layer)
        rows.index_copy_(0, key_rows, k.to(rows.dtype))
        rows.index_copy_(0, key_rows + self.page_tokens, v.to(rows.dtype))

    def kv_rows(self, slots):
        """Rows (see `rows`) of the keys of pool slots, then of their values: [2N] for N slots
        (numpy or torch alike), what `write_kv` takes."""
        keys = self.key_rows(slots)
        values = keys + self.page_tokens
        return torch.cat([keys, values]) if isinstance(keys, torch.Tensor) else np.concatenate([keys, values])

    def write_kv(self, layer: int, kv_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """`write` as one copy: k, v [N, kv_heads, head_dim] at `kv_rows` [2N] (`kv_rows`: key rows,
        then value rows), the index made once per step instead of once a layer."""
        rows = self.rows(layer)
        rows.index_copy_(0, kv_rows, torch.cat([k, v]).to(rows.dtype))

    def gather(self, layer: int, key_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [N, kv_heads, head_dim] of the slots whose key rows are given, as
        contiguous tensors (a DiT's text prefix, or FA3 over pages gathered per step)."""
        rows = self.rows(layer)
        return rows.index_select(0, key_rows), rows.index_select(0, key_rows + self.page_tokens)

    def describe(self) -> str:
        return (
            f"{self.num_pages} pages x {self.page_tokens} tokens = {self.num_tokens} tokens, "
            f"{self.geometry.describe()}, {self.nbytes / GIB:.2f} GiB on {self.device}"
        )


def size_pool(
    geometry: KVGeometry,
    device: torch.device | str,
    *,
    num_pages: int | None,
    memory_fraction: float,
    max_useful_pages: int,
    memory_cap_bytes: int | None = None,
) -> PoolSizing:
    """How many pages to allocate now (after weights and workspace): `num_pages` when given, else
    `memory_fraction` of the memory left on the device (at most `memory_cap_bytes` of it), at most
    `max_useful_pages`."""
    if num_pages is not None:
        return PoolSizing(num_pages, f"kv_pool_pages {num_pages}")
    free_bytes = free_memory_bytes(torch.device(device))
    counted = free_bytes if memory_cap_bytes is None else min(free_bytes, memory_cap_bytes)
    fitted = int(counted * memory_fraction) // geometry.page_bytes
    count = min(fitted, max_useful_pages)
    capped = "" if counted == free_bytes else f", counting at most {counted / GIB:.2f} GiB"
    reason = (
        f"{memory_fraction:g} of {free_bytes / GIB:.2f} GiB free after weights and workspace{capped} "
        f"({fitted} pages of {geometry.page_bytes / 1024**2:.3f} MiB)"
    )
    if count < fitted:
        reason += f", capped at the {max_useful_pages} pages the server can use"
    return PoolSizing(count, reason)


def free_memory_bytes(device: torch.device) -> int:
    """Free device memory (CUDA: the driver's count, plus what torch's allocator caches unused);
    on CPU, the host memory still available."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        cached_unused = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
        return int(free + cached_unused)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4 * GIB


def build_kv_pool(
    geometry: KVGeometry,
    device: torch.device | str,
    *,
    num_pages: int | None,
    memory_fraction: float,
    max_useful_pages: int,
    min_pages: int,
    enable_prefix_cache: bool = True,
    memory_cap_bytes: int | None = None,
) -> KVPool:
    """Size and allocate the pool; ValueError when it cannot hold `min_pages` (one longest request)."""
    sizing = size_pool(
        geometry,
        device,
        num_pages=num_pages,
        memory_fraction=memory_fraction,
        max_useful_pages=max_useful_pages,
        memory_cap_bytes=memory_cap_bytes,
    )
    if sizing.num_pages < min_pages:
        raise ValueError(
            f"KV pool: {sizing.num_pages} pages ({sizing.reason}) cannot hold one request of the "
            f"longest context ({min_pages} pages of {geometry.page_tokens} tokens, {geometry.describe()}); "
            "lower max_model_len or raise kv_cache_memory_fraction / kv_pool_pages"
        )
    pool = KVPool(geometry, sizing.num_pages, device, enable_prefix_cache)
    log.info("KV pool: %s (%s)", pool.describe(), sizing.reason)
    return pool


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
