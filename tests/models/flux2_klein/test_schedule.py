"""The klein sampler set-up against Flux2KleinPipeline's scheduler set-up (sigmas, timesteps, mu)
and the geometry's formulas against the pipeline's."""

import numpy as np
import pytest
import torch

from mstar.models.flux2_klein import geometry
from mstar.models.flux2_klein.config import KLEIN_4B, SchedulerConfig
from mstar.models.flux2_klein.schedule import make_sampler


def pipeline_schedule(config: SchedulerConfig, num_steps: int, image_seq_len: int):
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps

    scheduler = FlowMatchEulerDiscreteScheduler(**vars(config))
    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    mu = compute_empirical_mu(image_seq_len=image_seq_len, num_steps=num_steps)
    timesteps, _ = retrieve_timesteps(scheduler, num_steps, "cpu", sigmas=sigmas, mu=mu)
    return timesteps, scheduler.sigmas, mu


@pytest.mark.parametrize("num_steps", [1, 4, 50])
@pytest.mark.parametrize("image_seq_len", [64, 4096, 9216])  # 9216 > 4300: mu from the tokens only
def test_schedule_equals_pipeline(num_steps, image_seq_len):
    config = KLEIN_4B.scheduler
    timesteps, sigmas, mu = pipeline_schedule(config, num_steps, image_seq_len)
    sampler = make_sampler(config, num_steps, image_seq_len)
    assert torch.equal(sampler.timesteps, timesteps)
    assert torch.equal(sampler.sigmas, sigmas)
    assert geometry.empirical_mu(image_seq_len, num_steps) == mu


def test_static_shift_when_not_dynamic():
    config = SchedulerConfig(use_dynamic_shifting=False, shift=3.0)
    timesteps, sigmas, _ = pipeline_schedule(config, 4, 1024)
    sampler = make_sampler(config, 4, 1024)
    assert torch.equal(sampler.timesteps, timesteps) and torch.equal(sampler.sigmas, sigmas)


def test_sampler_steps_as_the_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    config = KLEIN_4B.scheduler
    scheduler = FlowMatchEulerDiscreteScheduler(**vars(config))
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.25, 4), mu=geometry.empirical_mu(256, 4))
    sampler = make_sampler(config, 4, 256)
    generator = torch.Generator().manual_seed(0)
    ours = theirs = torch.randn(16, 8, 8, generator=generator)
    for t in scheduler.timesteps:
        velocity = torch.randn(16, 8, 8, generator=generator)
        theirs = scheduler.step(velocity, t, theirs, return_dict=False)[0]
        ours = sampler.step(velocity, ours)
        assert torch.equal(ours, theirs)


def test_geometry_of_a_1024_edit():
    tokens = geometry.step_tokens(1024, 768, [(1500, 1000), (512, 512)])
    assert geometry.latent_grid(1024, 768) == (64, 48)
    assert tokens.num_output == 64 * 48
    # 1500x1000 is over 1 MP: scaled to 1254x836, cropped to 1248x832 -> 78 x 52 tokens.
    assert geometry.reference_pixel_size(1500, 1000) == (1248, 832)
    assert tokens.num_reference == (78 * 52, 32 * 32)
    assert tokens.num_tokens == 512 + 64 * 48 + 78 * 52 + 32 * 32
    assert geometry.step_cost_tokens(tokens, 2) == 2 * tokens.num_tokens
    assert geometry.default_output_size([(1500, 1000)]) == (832, 1248)
    assert geometry.default_output_size([]) == (1024, 1024)
    assert geometry.output_pixel_size(1000, 1030) == (992, 1024)


def test_guidance_labels_follow_is_distilled():
    assert geometry.guidance_labels(4.0, is_distilled=True) == ("cond",)
    assert geometry.guidance_labels(4.0, is_distilled=False) == ("cond", "uncond")
    assert geometry.guidance_labels(1.0, is_distilled=False) == ("cond",)
