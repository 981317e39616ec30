"""Per-request initial noise, drawn the way diffusers' `randn_tensor` draws it.

diffusers pipelines take a CPU `torch.Generator` seeded with the user's seed, draw
`torch.randn(shape)` on the CPU and move the result to the device. Doing the same here means a seed
gives the same starting latents as `pipe(..., generator=torch.Generator("cpu").manual_seed(seed))`.
A leading batch dimension of 1 does not change the values, so `shape` may omit it.
"""

from __future__ import annotations

import torch


def seeded_noise(
    shape: tuple[int, ...] | list[int],
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Standard normal noise of `shape` from a CPU generator seeded with `seed`, then moved to `device`."""
    generator = torch.Generator("cpu").manual_seed(int(seed))
    return torch.randn(tuple(shape), generator=generator, dtype=dtype).to(device)
