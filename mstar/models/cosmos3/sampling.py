"""The sampler of one Cosmos3 request and the guidance rule, as Cosmos3OmniPipeline.__call__ sets them up.

    sampler = make_sampler(config, num_steps=20, flow_shift=12.0)   # UniPC from the folder's config
    for timestep in sampler.timesteps:
        velocity = guide(cond_velocity, uncond_velocity, guidance_scale)   # float32
        latents = sampler.step(velocity, latents)

The folder's scheduler_config.json gives the UniPC settings; a flow shift from the recipe or the
request replaces the folder's (and its Karras spacing, which ignores any shift), as the published
examples do. With the pipeline's use_native_flow_schedule flag (Edge sets it) the unshifted sigmas
are linspace(1 - 1/1000, 0) instead of linspace(1, 1/1000).
"""

from __future__ import annotations

import torch

from mstar.diffusion.samplers import UniPCSampler, native_flow_sigmas
from mstar.models.cosmos3.config import Cosmos3Config


def make_sampler(config: Cosmos3Config, num_steps: int, flow_shift: float | None = None) -> UniPCSampler:
    """A fresh sampler for one request (`flow_shift` None: the folder's scheduler as it is)."""
    scheduler = config.scheduler if flow_shift is None else config.scheduler.with_flow_shift(flow_shift)
    sigmas = None
    if config.pipeline.use_native_flow_schedule:
        sigmas = native_flow_sigmas(num_steps, scheduler.num_train_timesteps)
    return UniPCSampler.from_config(scheduler, num_steps, sigmas)


def guide(cond: torch.Tensor, uncond: torch.Tensor | None, guidance_scale: float) -> torch.Tensor:
    """uncond + scale * (cond - uncond) in float32; cond alone without guidance (uncond None)."""
    cond = cond.float()
    if uncond is None:
        return cond
    uncond = uncond.float()
    return uncond + guidance_scale * (cond - uncond)
