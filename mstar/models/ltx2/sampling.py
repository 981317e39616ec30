"""LTX-2's sampler setup and guidance rule, as LTX2Pipeline applies them each step.

Schedule: sigmas linspace(1, 1/N, N), shifted by mu = calculate_shift(video tokens) (the
exponential time shift), stretched to end at the scheduler's shift_terminal; the audio latents
step on the same schedule (the pipeline's deep copy of the scheduler).

Guidance runs on the data estimates x0 = x - sigma * v of every pass (geometry's labels):

    x0 = x0_cond + (cfg - 1)(x0_cond - x0_uncond) + stg (x0_cond - x0_perturbed)
               + (modality - 1)(x0_cond - x0_isolated)
    x0 = rescale * x0 * std(x0_cond) / std(x0) + (1 - rescale) * x0        (guidance_rescale > 0)
    v  = (x - x0) / sigma

separately for video and audio, each with its own scales.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mstar.diffusion.samplers import FlowMatchEulerSampler
from mstar.models.ltx2.config import SchedulerConfig
from mstar.models.ltx2.geometry import COND, ISOLATED, MIN_STEPS, PERTURBED, UNCOND, schedule_mu


def default_sigmas(num_steps: int) -> list[float]:
    """LTX2Pipeline's sigmas before the shift: np.linspace(1, 1/N, N) (float64, as numpy gives it)."""
    return np.linspace(1.0, 1 / num_steps, num_steps).tolist()


def make_sampler(
    num_steps: int, num_video_tokens: int, scheduler: SchedulerConfig, sigmas: Sequence[float] | None = None
) -> FlowMatchEulerSampler:
    """The request's sampler (one for the video latents and one, equal, for the audio latents)."""
    if scheduler.time_shift_type != "exponential":
        raise ValueError(f"scheduler: time_shift_type '{scheduler.time_shift_type}' is not supported")
    if scheduler.shift_terminal and num_steps < MIN_STEPS:
        # One sigma of 1 cannot be stretched to end at shift_terminal: the pipeline's are NaN.
        raise ValueError(f"num_inference_steps must be >= {MIN_STEPS} with a terminal shift, got {num_steps}")
    mu = schedule_mu(num_video_tokens, scheduler) if scheduler.use_dynamic_shifting else None
    return FlowMatchEulerSampler(
        num_steps,
        shift=scheduler.shift,
        sigmas=list(sigmas) if sigmas is not None else default_sigmas(num_steps),
        mu=mu,
        num_train_timesteps=scheduler.num_train_timesteps,
        shift_terminal=scheduler.shift_terminal,
    )


@dataclass(frozen=True)
class StreamGuidance:
    """One stream's guidance scales."""

    guidance_scale: float = 1.0
    stg_scale: float = 0.0
    modality_scale: float = 1.0
    guidance_rescale: float = 0.0


def resolve_audio_scales(video: StreamGuidance, audio: StreamGuidance) -> StreamGuidance:
    """The pipeline's fallbacks: an audio scale that is 0 or unset takes the video one (`or`)."""
    return StreamGuidance(
        guidance_scale=audio.guidance_scale or video.guidance_scale,
        stg_scale=audio.stg_scale or video.stg_scale,
        modality_scale=audio.modality_scale or video.modality_scale,
        guidance_rescale=audio.guidance_rescale or video.guidance_rescale,
    )


def _rescale(guided: torch.Tensor, cond: torch.Tensor, factor: float) -> torch.Tensor:
    """rescale_noise_cfg over one item (std over every element, unbiased as torch's default)."""
    rescaled = guided * (cond.std() / guided.std())
    return factor * rescaled + (1 - factor) * guided


def guide(
    sample: torch.Tensor, sigma: torch.Tensor, velocities: Mapping[str, torch.Tensor], scales: StreamGuidance
) -> torch.Tensor:
    """One stream of one request: the velocity the sampler steps with, from each label's velocity
    (float32; labels absent from `velocities` contribute nothing: a perturbed pass that equals
    `cond` has a zero term). sigma: the step's sigma (0-d float32)."""
    sample = sample.float()
    x0 = {label: sample - v.float() * sigma for label, v in velocities.items()}
    cond = x0[COND]
    guided = cond
    if UNCOND in x0:
        guided = guided + (scales.guidance_scale - 1) * (cond - x0[UNCOND])
    if PERTURBED in x0:
        guided = guided + scales.stg_scale * (cond - x0[PERTURBED])
    if ISOLATED in x0:
        guided = guided + (scales.modality_scale - 1) * (cond - x0[ISOLATED])
    if scales.guidance_rescale > 0:
        guided = _rescale(guided, cond, scales.guidance_rescale)
    return (sample - guided) / sigma


def initial_noise(
    seed: int, video_shape: Sequence[int], audio_shape: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The request's starting noise as LTX2Pipeline draws it: one CPU generator seeded with the
    seed, the video latents first, then the audio latents (float32, on the host)."""
    generator = torch.Generator("cpu").manual_seed(int(seed))
    video = torch.randn(tuple(video_shape), generator=generator, dtype=torch.float32)
    audio = torch.randn(tuple(audio_shape), generator=generator, dtype=torch.float32)
    return video, audio
