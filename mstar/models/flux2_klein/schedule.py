"""The sampler a klein request runs, set up as Flux2KleinPipeline sets its scheduler: sigmas
np.linspace(1, 1/N, N), time-shifted with the pipeline's empirical mu (from the output's token
count and N) when the scheduler shifts dynamically, else by its static shift; Euler steps."""

from __future__ import annotations

from mstar.diffusion.samplers import FlowMatchEulerSampler, numpy_linear_sigmas
from mstar.models.flux2_klein.config import SchedulerConfig
from mstar.models.flux2_klein.geometry import empirical_mu


def make_sampler(scheduler: SchedulerConfig, num_steps: int, num_output_tokens: int) -> FlowMatchEulerSampler:
    """num_output_tokens: the output's latent tokens (not the references'), as the pipeline's
    image_seq_len = latents.shape[1]."""
    mu = None
    if scheduler.use_dynamic_shifting:
        if scheduler.time_shift_type != "exponential":
            raise ValueError(
                f"time_shift_type '{scheduler.time_shift_type}' is not supported (exponential only)"
            )
        mu = empirical_mu(num_output_tokens, num_steps)
    return FlowMatchEulerSampler(
        num_steps,
        shift=scheduler.shift,
        sigmas=numpy_linear_sigmas(num_steps),
        mu=mu,
        num_train_timesteps=scheduler.num_train_timesteps,
    )
