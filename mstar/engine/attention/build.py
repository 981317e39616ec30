"""Pick, build and validate the attention backend at boot.

`auto` takes FA3 (Hopper and fa3-fwd importable), else FlashInfer (importable), else torch; each
choice passes a tiny plan-and-run against SDPA before it is used, and `auto` moves on to the next
one when a choice fails that check. An explicit backend that cannot run here fails boot with a
ValueError naming the backend, the GPU (or "cpu") and the library version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from mstar.engine.attention.backends import AttentionBackend
from mstar.engine.attention.backends.fa3 import FA3Backend
from mstar.engine.attention.backends.flashinfer import FLASHINFER_KERNEL_BACKENDS, FlashInferBackend
from mstar.engine.attention.backends.torch_backend import TorchBackend
from mstar.engine.attention.layout import AttentionLayout
from mstar.engine.attention.platform import Libraries, Platform, detect_platform
from mstar.engine.attention.ragged import DEFAULT_NUM_SLOTS, RaggedAttention
from mstar.engine.attention.reference import reference_attention
from mstar.engine.workspace import shared_workspace

logger = logging.getLogger("mstar.engine.attention")

BACKEND_NAMES = ("fa3", "flashinfer", "torch")
BOOT_LABEL = "__boot__"
BOOT_LAYOUTS = (
    AttentionLayout.self_attention((7, 13)),
    AttentionLayout.cross_attention((7, 13), (5, 3)),
)
BOOT_NUM_HEADS, BOOT_HEAD_DIM = 2, 128
# relative error allowed against fp32 SDPA at boot: bf16 rounding of inputs and outputs
BOOT_TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def build_attention(
    backend: str = "auto",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    flashinfer_backend: str = "auto",
    workspace_mb: int = 512,
    *,
    workspace: torch.Tensor | None = None,
    num_slots: int = DEFAULT_NUM_SLOTS,
    cuda_graph: bool = False,
    libraries: Mapping[str, Any] | None = None,
    platform: Platform | None = None,
) -> RaggedAttention:
    """Build the attention resource for `device`; raises ValueError when the choice cannot run.

    `workspace` (uint8, on the device) is shared by every wrapper; when None the process-wide
    workspace of the device (at least workspace_mb MiB) is taken, allocated here if it is the first. `libraries` and `platform` replace the real
    imports and device query (tests).
    """
    platform = platform or detect_platform(torch.device(device))
    libs = Libraries(libraries)
    if flashinfer_backend not in FLASHINFER_KERNEL_BACKENDS:
        raise ValueError(
            f"flashinfer_backend '{flashinfer_backend}' is unknown (choose one of "
            f"{', '.join(FLASHINFER_KERNEL_BACKENDS)}); device {platform.describe()}, {libs.describe('flashinfer')}"
        )
    if workspace is None:
        workspace = shared_workspace(platform.device, workspace_mb)
    candidates = backend_candidates(backend, platform, libs)
    for index, (name, reason) in enumerate(candidates):
        try:
            kernels = _make_backend(name, platform, libs, flashinfer_backend, workspace)
            attention = RaggedAttention(kernels, platform.device, dtype, workspace, num_slots, cuda_graph)
            check_against_reference(attention, platform)
        except ValueError as error:
            if backend != "auto" or index == len(candidates) - 1:
                raise
            logger.warning("attention backend %s failed its boot check, trying the next: %s", name, error)
            continue
        logger.info(
            "attention backend: %s (%s) on %s; %s", name, kernels.version, platform.describe(), reason
        )
        return attention
    raise AssertionError("unreachable: auto always ends with torch")


def backend_candidates(requested: str, platform: Platform, libs: Libraries) -> list[tuple[str, str]]:
    """[(backend, why)] to try in order; raises ValueError for a backend that cannot run here."""
    if requested == "auto":
        return _auto_candidates(platform, libs)
    if requested not in BACKEND_NAMES:
        versions = ", ".join(libs.describe(name) for name in ("torch", "fa3", "flashinfer"))
        raise ValueError(
            f"attention backend '{requested}' is unknown (choose auto, {', '.join(BACKEND_NAMES)}); "
            f"device {platform.describe()}; {versions}"
        )
    problem = _why_not(requested, platform, libs)
    if problem is not None:
        raise ValueError(
            f"attention backend '{requested}' cannot run on {platform.describe()}: {problem} "
            f"({libs.describe(_library_of(requested))})"
        )
    return [(requested, "requested in the config")]


def _auto_candidates(platform: Platform, libs: Libraries) -> list[tuple[str, str]]:
    candidates: list[tuple[str, str]] = []
    for name in ("fa3", "flashinfer"):
        problem = _why_not(name, platform, libs)
        if problem is None:
            candidates.append((name, f"auto: {libs.describe(name)} importable on {platform.describe()}"))
        else:
            logger.info("attention auto: skipping %s: %s", name, problem)
    torch_reason = "varlen_attn" if platform.is_cuda else "SDPA per segment"
    candidates.append(("torch", f"auto: fallback, {torch_reason}"))
    return candidates


def _why_not(name: str, platform: Platform, libs: Libraries) -> str | None:
    """None when `name` can run on this platform, else the reason it cannot."""
    if name == "torch":
        return None
    if not platform.is_cuda:
        return "needs a CUDA GPU"
    if name == "fa3" and not platform.is_hopper:
        return "FA3 kernels need a Hopper GPU (sm_90)"
    if libs.module(name) is None:
        return f"cannot import {_library_of(name)}: {libs.import_error(name)}"
    return None


def _library_of(name: str) -> str:
    return "torch" if name == "torch" else name


def _make_backend(
    name: str, platform: Platform, libs: Libraries, flashinfer_backend: str, workspace: torch.Tensor
) -> AttentionBackend:
    if name == "fa3":
        return FA3Backend(platform.device, libs.module("fa3"), libs.version("fa3"))
    if name == "flashinfer":
        return FlashInferBackend(
            platform.device,
            libs.module("flashinfer"),
            libs.version("flashinfer"),
            flashinfer_backend,
            workspace,
        )
    return TorchBackend(platform.device)


def check_against_reference(attention: RaggedAttention, platform: Platform) -> None:
    """Plan and run tiny self and cross layouts; any error or a wrong answer fails boot."""
    generator = torch.Generator().manual_seed(0)
    tolerance = BOOT_TOLERANCE.get(attention.dtype, 2e-2)
    try:
        for layout in BOOT_LAYOUTS:
            q, k, v = _random_qkv(layout, generator, attention)
            attention.plan(BOOT_LABEL, layout)
            out = attention.run(BOOT_LABEL, q, k, v)
            expected = reference_attention(q.float(), k.float(), v.float(), layout)
            error = relative_error(out.float(), expected)
            if not error <= tolerance:
                raise RuntimeError(f"output differs from SDPA: relative error {error:.3g} > {tolerance}")
    except Exception as error:
        raise ValueError(
            f"attention backend '{attention.backend_name}' failed its boot check on {platform.describe()} "
            f"with {attention.dtype} ({attention.backend.version}, torch {torch.__version__}): {error}"
        ) from error
    finally:
        attention.discard(BOOT_LABEL)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-12))


def _random_qkv(
    layout: AttentionLayout, generator: torch.Generator, attention: RaggedAttention
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shapes = [(layout.total_q, BOOT_NUM_HEADS, BOOT_HEAD_DIM)] + [
        (layout.total_kv, BOOT_NUM_HEADS, BOOT_HEAD_DIM)
    ] * 2
    tensors = [torch.randn(shape, generator=generator) for shape in shapes]
    q, k, v = (t.to(device=attention.device, dtype=attention.dtype) for t in tensors)
    return q, k, v
