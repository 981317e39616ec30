"""Warmup requests shared by the diffusion models: one short request per configured size, sent
through the whole walk at boot so that no user request is the first to run any part of it."""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams, ModelSpec

WARMUP_STEPS = 2  # two steps run both the first and a later sampler step (UniPC's order changes)


def sized_warmup_requests(spec: ModelSpec, compile_sizes: list[str]) -> list[dict[str, Any]]:
    """Validated params for each 'WxH' / 'WxHxFRAMES' in compile_sizes (the default size if none)."""
    sizes = compile_sizes or [None]
    return [_validated(spec, size) for size in sizes]


def _validated(spec: ModelSpec, size: str | None) -> dict[str, Any]:
    width = height = num_frames = None
    if size is not None:
        width, height, *frames = (int(part) for part in size.split("x"))
        num_frames = frames[0] if frames else None
    params = GenerationParams(
        prompt="warmup",
        width=width,
        height=height,
        num_frames=num_frames,
        num_inference_steps=WARMUP_STEPS,
        seed=0,
    )
    try:
        return spec.validate(params)
    except InvalidParam as error:
        raise ValueError(f"compile_sizes: '{size}' is not a valid size for {spec.name}: {error}") from error
