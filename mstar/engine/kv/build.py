"""Pick, build and check the paged attention backend at boot, as the ragged resource does.

`auto` takes FlashInfer (importable, CUDA), else FA3 over gathered pages (Hopper, fa3-fwd), else the
torch reference. Every choice plans and runs a small mixed step (decode rows and causal prefill
chunks, GQA, the model's heads and dtype) against the torch reference before it serves; that run
is also where FlashInfer compiles its kernels (JIT, 25-95 s on an H200 the first time), at boot and
into `<kernel_cache_dir>/flashinfer`, never in traffic. An explicit backend that cannot run fails
boot with a ValueError naming the backend, the GPU (or "cpu") and the library version.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from mstar.engine.attention.platform import Libraries, Platform, detect_platform
from mstar.engine.kv.attention import PagedAttention, PagedBackend, PagedHeads
from mstar.engine.kv.backends.torch_paged import TorchPagedBackend
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVGeometry, KVPool

log = logging.getLogger("mstar.engine.kv")

PAGED_BACKENDS = ("auto", "flashinfer", "fa3", "torch")
FLASHINFER_CACHE_ENV = "FLASHINFER_WORKSPACE_BASE"
BOOT_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
BOOT_GRAPH_ROWS = 2


def use_flashinfer_cache(directory: str | None) -> None:
    """FlashInfer's JIT builds go under `directory`/flashinfer (read when flashinfer is first
    imported, so call before); a location already set in the environment wins."""
    if directory:
        root = os.path.join(os.path.abspath(os.path.expanduser(directory)), "flashinfer")
        os.environ.setdefault(FLASHINFER_CACHE_ENV, root)


def build_paged_attention(
    pool: KVPool,
    heads: PagedHeads,
    backend: str = "auto",
    *,
    flashinfer_backend: str = "auto",
    workspace: torch.Tensor | None = None,
    cuda_graphs: bool = False,
    max_graph_page_indices: int = 0,
    libraries: Mapping[str, Any] | None = None,
    platform: Platform | None = None,
) -> PagedAttention:
    """The attention resource over `pool`, checked against the reference before it is returned.
    `max_graph_page_indices`: page-table entries a captured step may need beyond one per pool page
    (rows that repeat a shared prefix's pages: a prompt's tail replayed as decode rows)."""
    platform = platform or detect_platform(pool.device)
    libs = Libraries(libraries)
    candidates = paged_candidates(backend, platform, libs)
    for index, name in enumerate(candidates):
        try:
            kernels = _make_backend(
                name, platform, libs, heads, flashinfer_backend, workspace,
                max(pool.num_pages + 1, max_graph_page_indices),
            )  # fmt: skip
            check_paged_backend(kernels, heads, platform, graphs=cuda_graphs and name == "flashinfer")
        except ValueError as error:
            if backend != "auto" or index == len(candidates) - 1:
                raise
            log.warning("paged attention %s failed its boot check, trying the next: %s", name, error)
            continue
        log.info("paged attention backend: %s on %s", kernels.version, platform.describe())
        return PagedAttention(kernels, pool, heads)
    raise AssertionError("unreachable: auto always ends with torch")


def paged_candidates(requested: str, platform: Platform, libs: Libraries) -> list[str]:
    if requested not in PAGED_BACKENDS:
        raise ValueError(
            f"kv attention backend '{requested}' is unknown (choose one of {', '.join(PAGED_BACKENDS)}); "
            f"device {platform.describe()}"
        )
    if requested == "auto":
        found = [name for name in ("flashinfer", "fa3") if _why_not(name, platform, libs) is None]
        return [*found, "torch"]
    problem = _why_not(requested, platform, libs)
    if problem is not None:
        raise ValueError(
            f"kv attention backend '{requested}' cannot run on {platform.describe()}: {problem} "
            f"({libs.describe(requested) if requested != 'torch' else libs.describe('torch')})"
        )
    return [requested]


def _why_not(name: str, platform: Platform, libs: Libraries) -> str | None:
    if name == "torch":
        return None
    if not platform.is_cuda:
        return "needs a CUDA GPU"
    if name == "fa3" and not platform.is_hopper:
        return "FA3 kernels need a Hopper GPU (sm_90)"
    if libs.module(name) is None:
        return f"cannot import {name}: {libs.import_error(name)}"
    return None


def _make_backend(
    name: str,
    platform: Platform,
    libs: Libraries,
    heads: PagedHeads,
    flashinfer_backend: str,
    workspace: torch.Tensor | None,
    max_pages: int,
) -> PagedBackend:
    if name == "flashinfer":
        from mstar.engine.kv.backends.flashinfer_paged import FlashInferPagedBackend
        from mstar.engine.workspace import shared_workspace

        workspace = workspace if workspace is not None else shared_workspace(platform.device, 256)
        return FlashInferPagedBackend(
            platform.device, heads, libs.module("flashinfer"), libs.version("flashinfer"),
            flashinfer_backend, workspace, max_pages=max_pages,
        )  # fmt: skip
    if name == "fa3":
        from mstar.engine.kv.backends.fa3_paged import FA3PagedBackend

        return FA3PagedBackend(platform.device, heads, libs.module("fa3"), libs.version("fa3"))
    return TorchPagedBackend(platform.device, heads)


def check_paged_backend(backend: PagedBackend, heads: PagedHeads, platform: Platform, graphs: bool) -> None:
    """Plan and run a small step on a scratch pool; any error or a wrong answer is a ValueError."""
    try:
        pool = KVPool(
            KVGeometry(1, heads.num_kv_heads, heads.head_dim, heads.dtype, heads.page_tokens),
            12,
            platform.device,
        )
        generator = torch.Generator().manual_seed(0)
        pool.cache.copy_(torch.randn(pool.cache.shape, generator=generator).to(pool.cache))
        tokens = heads.page_tokens
        kv_lens = [tokens + 3, 2, tokens + 5, 3]  # two decode rows, a chunk after cached tokens, a prompt
        page_ids, next_page = [], 0
        for kv_len in kv_lens:
            count = -(-kv_len // tokens)
            page_ids.append(list(range(next_page, next_page + count)))
            next_page += count
        layout = PagedLayout.build([1, 1, 5, 3], kv_lens, page_ids, tokens)
        _compare(backend, pool, heads, layout, generator, graph_rows=None)
        if graphs:
            decode = layout.part(0, 2)
            _compare(backend, pool, heads, decode, generator, graph_rows=BOOT_GRAPH_ROWS)
    except Exception as error:
        raise ValueError(
            f"kv attention backend '{backend.name}' failed its boot check on {platform.describe()} with "
            f"{heads.dtype} ({_versions(backend)}): {error}"
        ) from error


def _compare(
    backend: PagedBackend,
    pool: KVPool,
    heads: PagedHeads,
    layout: PagedLayout,
    generator: torch.Generator,
    graph_rows: int | None,
) -> None:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator).to(device=pool.device, dtype=heads.dtype)

    q = randn(layout.total_q, heads.num_q_heads, heads.head_dim)
    k, v = (randn(layout.total_q, heads.num_kv_heads, heads.head_dim) for _ in range(2))
    attention = PagedAttention(backend, pool, heads)
    planned = attention.plan(layout, graph_rows=graph_rows)
    if planned.total_q != layout.total_q:  # padded for a graph: pad the inputs alike
        extra = planned.total_q - layout.total_q
        q = torch.cat([q, q.new_zeros(extra, *q.shape[1:])])
        k, v = (torch.cat([t, t.new_zeros(extra, *t.shape[1:])]) for t in (k, v))
    out = attention.forward(0, q, k, v)[: layout.total_q]
    reference = TorchPagedBackend(pool.device, heads).make_wrapper(captured=False)
    reference.plan(layout)
    expected = reference.run_paged(q[: layout.total_q].float(), _as_float(pool), 0)
    error = float((out.float() - expected).norm() / expected.norm().clamp_min(1e-12))
    tolerance = BOOT_TOLERANCE.get(heads.dtype, 2e-2)
    if not error <= tolerance:
        raise RuntimeError(
            f"output differs from the torch reference: relative error {error:.3g} > {tolerance}"
        )


def _as_float(pool: KVPool) -> KVPool:
    """A float32 copy of a small pool (the reference runs in float32)."""
    copy = KVPool(
        KVGeometry(
            pool.geometry.num_layers, pool.geometry.num_kv_heads, pool.geometry.head_dim,
            torch.float32 if pool.cache.dtype != torch.float64 else torch.float64, pool.page_tokens,
        ),
        pool.num_pages,
        pool.device,
    )  # fmt: skip
    copy.cache.copy_(pool.cache)
    return copy


def _versions(backend: PagedBackend) -> str:
    torch_version = f"torch {torch.__version__}"
    return backend.version if backend.version == torch_version else f"{backend.version}, {torch_version}"
