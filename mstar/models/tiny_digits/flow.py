"""Rectified-flow training pieces, in FlowMatchEulerSampler's convention.

x_sigma = (1 - sigma) * x0 + sigma * noise, sigma in [0, 1] (1 = pure noise); the DiT sees
timestep = sigma * 1000 and predicts the velocity noise - x0, so one Euler step is
x <- x + (sigma_next - sigma) * velocity.
"""

from __future__ import annotations

import torch

from mstar.diffusion.samplers import NUM_TRAIN_TIMESTEPS


def shift_sigmas(sigmas: torch.Tensor, shift: float) -> torch.Tensor:
    """The sigma shift flow-match schedulers apply (shift 1 leaves sigmas unchanged)."""
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def noisy_sample(
    x0: torch.Tensor, generator: torch.Generator, shift: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x0 [B, ...] -> (x_sigma, timesteps [B], target velocity), sigma drawn logit-normal then shifted."""
    num_items = x0.shape[0]
    sigmas = shift_sigmas(torch.sigmoid(torch.randn(num_items, generator=generator)), shift)
    noise = torch.randn(x0.shape, generator=generator)
    sigma_b = sigmas.view(num_items, *([1] * (x0.dim() - 1)))
    x_sigma = (1 - sigma_b) * x0 + sigma_b * noise
    return x_sigma, sigmas * NUM_TRAIN_TIMESTEPS, noise - x0
