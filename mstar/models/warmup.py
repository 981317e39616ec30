"""Warmup requests shared by the diffusion models: one short request per configured size, sent
through the whole walk at boot so that no user request is the first to run any part of it."""

from __future__ import annotations

from mstar.config import CompileSize
from mstar.errors import InvalidParam
from mstar.graph import GenerationParams, ModelSpec
from mstar.params import RequestParams

WARMUP_STEPS = 2  # two steps run both the first and a later sampler step (UniPC's order changes)


def sized_warmup_requests(spec: ModelSpec, compile_sizes: list[CompileSize]) -> list[RequestParams]:
    """Validated params for each of the config's compile sizes (the model's default size if none)."""
    sizes = compile_sizes or [None]
    return [_validated(spec, size) for size in sizes]


def _validated(spec: ModelSpec, size: CompileSize | None) -> RequestParams:
    params = GenerationParams(
        prompt="warmup",
        width=None if size is None else size.width,
        height=None if size is None else size.height,
        num_frames=None if size is None else size.num_frames,
        num_inference_steps=WARMUP_STEPS,
        seed=0,
    )
    try:
        return spec.validate(params)
    except InvalidParam as error:
        raise ValueError(f"compile_sizes: '{size}' is not a valid size for {spec.name}: {error}") from error
