"""The benchmarks' registry view and diffusers' side of them: every family's workloads (from its
bench entry, models/registry.py), diffusers' transformer built as from_pretrained(torch_dtype=...)
would load it, and how far ours is from it (relative error, PSNR)."""

from __future__ import annotations

from typing import Any

from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload, StepWorkload


def step_workloads() -> dict[str, tuple[DitBenchEntry, StepWorkload]]:
    """name -> (its family's bench entry, the workload), over every registered family."""
    from mstar.models.registry import bench_entries

    return {w.name: (entry, w) for entry in bench_entries() for w in entry.step_workloads}


def e2e_workloads() -> dict[str, tuple[DitBenchEntry, EndToEndWorkload]]:
    from mstar.models.registry import bench_entries

    return {w.name: (entry, w) for entry in bench_entries() for w in entry.e2e_workloads}


def cast_parameters(model: Any, dtype: Any, keep_fp32: tuple[str, ...] | list[str] | None) -> Any:
    """Parameters to `dtype`, except modules named in `keep_fp32` (diffusers' _keep_in_fp32_modules
    rule, as from_pretrained(torch_dtype=...) applies it); buffers (rotary tables) are left as built."""
    import torch

    keep = set(keep_fp32 or ())
    for name, param in model.named_parameters():
        target = torch.float32 if keep.intersection(name.split(".")) else dtype
        if param.is_floating_point() and param.dtype != target:
            param.data = param.data.to(target)
    return model


def diffusers_transformer(
    entry: DitBenchEntry, transformer_config: dict[str, Any], device: str, dtype: Any, seed: int
):
    """diffusers' transformer of the family from its config with a seeded random init, on `device`."""
    import diffusers
    import torch

    model_class = getattr(diffusers, entry.diffusers_transformer)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(**transformer_config)
    return cast_parameters(model, dtype, model_class._keep_in_fp32_modules).eval().requires_grad_(False)


def output_psnr_db(ours: list[Any], reference: list[Any]) -> float:
    """PSNR (dB) of ours against the reference over all items: the reference's value range as the
    peak, in float32 (inf when equal)."""
    import math

    pairs = [(a.float().reshape(b.shape), b.float()) for a, b in zip(ours, reference, strict=True)]
    squared = sum(float((a - b).pow(2).sum()) for a, b in pairs)
    count = sum(b.numel() for _, b in pairs)
    peak = max(float(b.max() - b.min()) for _, b in pairs)
    if squared == 0:
        return math.inf
    mse = squared / max(count, 1)
    return 10 * math.log10(peak**2 / mse) if math.isfinite(mse) and peak > 0 else -math.inf


def relative_error(ours: list[Any], reference: list[Any]) -> float:
    """||ours - reference|| / ||reference|| over all items, in float32."""
    import torch

    # Shapes may differ by a unit frame axis (Z-Image: ours [C, H, W], diffusers [C, 1, H, W]).
    pairs = [(a.float().reshape(b.shape), b.float()) for a, b in zip(ours, reference, strict=True)]
    diff = sum(float((a - b).pow(2).sum()) for a, b in pairs)
    norm = sum(float(b.pow(2).sum()) for _, b in pairs)
    return (diff / max(norm, 1e-30)) ** 0.5 if torch.isfinite(torch.tensor(diff)) else float("inf")
