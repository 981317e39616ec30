"""Z-Image's sampler schedule against the pipeline's scheduler set-up (sigmas, timesteps, mu)."""

import pytest
import torch

from mstar.models.zimage.config import SchedulerConfig
from mstar.models.zimage.pipeline import image_shift_mu, make_sampler, model_timestep


def pipeline_schedule(config: SchedulerConfig, num_steps: int, latent_height: int, latent_width: int):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.z_image.pipeline_z_image import (
        calculate_shift,
        get_default_z_image_sigmas,
        retrieve_timesteps,
    )

    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=config.num_train_timesteps, shift=config.shift,
        use_dynamic_shifting=config.use_dynamic_shifting,
    )  # fmt: skip
    image_seq_len = (latent_height // 2) * (latent_width // 2)
    mu = calculate_shift(image_seq_len, 256, 4096, 0.5, 1.15)
    sigmas = get_default_z_image_sigmas(num_steps)
    timesteps, _ = retrieve_timesteps(scheduler, num_steps, "cpu", sigmas=sigmas, mu=mu)
    return timesteps, scheduler.sigmas, mu


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("num_steps", [1, 9])
def test_schedule_equals_pipeline(dynamic, num_steps):
    config = SchedulerConfig(use_dynamic_shifting=dynamic)
    timesteps, sigmas, mu = pipeline_schedule(config, num_steps, 128, 96)
    sampler = make_sampler(config, num_steps, 128, 96)
    assert torch.equal(sampler.timesteps, timesteps)
    assert torch.equal(sampler.sigmas, sigmas)
    assert image_shift_mu(config, 64 * 48) == mu


def test_model_timestep_is_the_pipelines_float32_rescale():
    t = torch.tensor(871.2345, dtype=torch.float32)
    assert model_timestep(float(t)) == float((1000 - t) / 1000)
    assert model_timestep(1000.0) == 0.0
