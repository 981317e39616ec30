"""Our DiTs as the step benchmark drives them: the family's eager model from its diffusers config
(its bench entry), given diffusers' state dict (keys identical by contract), then sped up in the
server's one order (mstar.models.scaffold.speed_up: optimize -> compile) and run on item lists.

MSTAR_FUSE_PROJECTIONS / MSTAR_TRITON_KERNELS override the server's rule (CUDA; Triton installed)
for A/B runs and CPU tests; MSTAR_BENCH_KEEP_TEXT=0 recomputes text-only work every step.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from mstar.bench.baseline import cast_parameters
from mstar.models.bench_entry import DitBenchEntry

TRITON_KERNELS_ENV = "MSTAR_TRITON_KERNELS"
FUSE_PROJECTIONS_ENV = "MSTAR_FUSE_PROJECTIONS"
# As served: a request's text-only work (Wan's cross-attention keys/values, Z-Image's refined
# caption) runs at its first step and is reused; the step figure is the cost of every later step.
KEEP_PER_REQUEST = os.environ.get("MSTAR_BENCH_KEEP_TEXT", "1") != "0"
FP32_PARAMETERS = "fp32_param_patterns"


class OursUnavailable(RuntimeError):
    """Our DiT cannot be built here; the message says why (missing module, backend, ...)."""


def build_ours(
    entry: DitBenchEntry,
    config: dict[str, Any],
    state_dict: dict[str, Any] | None,
    device: str,
    dtype: Any,
    attention_backend: str,
    compile_mode: str,
    seed: int = 0,
) -> Callable[[list[dict]], list[Any]]:
    """A callable items -> outputs (one per item) running our DiT with the given attention backend
    and compile mode (the engine's own compile path)."""
    import torch

    from mstar.models.scaffold import speed_up

    try:
        from mstar.engine.attention import build_attention

        attention = build_attention(backend=attention_backend, device=device, dtype=dtype)
    except (ImportError, ValueError) as error:
        raise OursUnavailable(f"attention backend '{attention_backend}': {error}") from error
    # Built on the device (not meta: a DiT may compute tables at init), then given diffusers' weights;
    # without diffusers, our own seeded init stands.
    torch.manual_seed(seed)
    with torch.device(device):
        dit = entry.make_ours(config)
    if state_dict is not None:
        dit.load_state_dict(state_dict, strict=True)
    dit = cast_parameters(dit.to(device=device), dtype, getattr(dit, FP32_PARAMETERS, None))
    dit = dit.eval().requires_grad_(False)
    fuse = fuse_projections_enabled(device)
    kernels = fuse and triton_kernels_enabled(device)
    dit, _ = speed_up(dit, entry.optimize, fuse, kernels, compile_mode, f"bench.{entry.family}")
    return entry.ours_forward(dit, attention, KEEP_PER_REQUEST)


def _env_switch(name: str) -> bool | None:
    """An on/off environment switch: "1" on, "0" off, unset or empty None (the caller's default)."""
    setting = os.environ.get(name, "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got '{setting}'")
    return None if setting == "" else setting == "1"


def triton_kernels_enabled(device: str) -> bool:
    """MSTAR_TRITON_KERNELS=1 uses the hand-written kernels where projections are fused (on the CPU:
    the ops' PyTorch definitions), =0 never; unset: ServerConfig's rule (CUDA with Triton)."""
    switch = _env_switch(TRITON_KERNELS_ENV)
    if switch is not None:
        return switch
    from mstar.engine.kernels import triton_kernels_usable

    return triton_kernels_usable(device)


def fuse_projections_enabled(device: str) -> bool:
    """MSTAR_FUSE_PROJECTIONS=1 fuses anywhere, =0 never; unset: on CUDA only (ServerConfig's rule)."""
    switch = _env_switch(FUSE_PROJECTIONS_ENV)
    return str(device).startswith("cuda") if switch is None else switch
