"""Our samplers against diffusers' schedulers: same schedule and, step by step, the same samples."""

import pytest
import torch

from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, UniPCSampler, linear_sigmas

diffusers = pytest.importorskip("diffusers")

WAN_UNIPC_CONFIG = {
    "beta_end": 0.02,
    "beta_schedule": "linear",
    "beta_start": 0.0001,
    "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995,
    "final_sigmas_type": "zero",
    "flow_shift": 5.0,
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "predict_x0": True,
    "prediction_type": "flow_prediction",
    "rescale_betas_zero_snr": False,
    "sample_max_value": 1.0,
    "solver_order": 2,
    "solver_p": None,
    "solver_type": "bh2",
    "steps_offset": 0,
    "thresholding": False,
    "timestep_spacing": "linspace",
    "trained_betas": None,
    "use_beta_sigmas": False,
    "use_exponential_sigmas": False,
    "use_flow_sigmas": True,
    "use_karras_sigmas": False,
}


def _fake_velocity(sample: torch.Tensor, t: float, step: int) -> torch.Tensor:
    """A deterministic stand-in for the DiT that depends on the sample and the step."""
    return torch.tanh(sample * (1 + 0.1 * step)) + 0.001 * t


def _run_both(ours, theirs, timesteps, shape=(2, 3, 4, 4), seed=7, num_compared=None):
    ours_sample = seeded_noise(shape, seed)
    theirs_sample = ours_sample.clone()
    assert torch.equal(ours.timesteps, timesteps.to(torch.float32))
    for step, t in enumerate(timesteps):
        velocity = _fake_velocity(ours_sample, float(t), step)
        ours_sample = ours.step(velocity, ours_sample)
        theirs_velocity = _fake_velocity(theirs_sample, float(t), step)
        theirs_sample = theirs.step(theirs_velocity, t, theirs_sample, return_dict=False)[0]
        if num_compared is not None and step >= num_compared:
            break
        scale = theirs_sample.abs().max()
        assert (ours_sample - theirs_sample).abs().max() <= 1e-6 * max(1.0, float(scale)), step
    assert ours.done or num_compared is not None


@pytest.mark.parametrize("num_steps", [1, 2, 5, 12])
@pytest.mark.parametrize("shift", [1.0, 5.0])
def test_unipc_matches_diffusers(num_steps, shift):
    config = dict(WAN_UNIPC_CONFIG, flow_shift=shift)
    theirs = diffusers.UniPCMultistepScheduler.from_config(config)
    theirs.set_timesteps(num_steps)
    theirs.set_begin_index(0)
    ours = UniPCSampler(num_steps, shift=shift)
    assert torch.equal(ours.sigmas, theirs.sigmas)
    _run_both(ours, theirs, theirs.timesteps)


@pytest.mark.parametrize("solver_type", ["bh1", "bh2"])
def test_unipc_third_order_matches_diffusers(solver_type):
    config = dict(WAN_UNIPC_CONFIG, solver_order=3, solver_type=solver_type, disable_corrector=[1])
    theirs = diffusers.UniPCMultistepScheduler.from_config(config)
    theirs.set_timesteps(7)
    theirs.set_begin_index(0)
    ours = UniPCSampler(7, shift=5.0, solver_order=3, solver_type=solver_type, disable_corrector=(1,))
    # diffusers' bh1 final step computes -inf * 0 = NaN; ours stays finite, so compare the steps before.
    _run_both(ours, theirs, theirs.timesteps, num_compared=6 if solver_type == "bh1" else None)


@pytest.mark.parametrize("num_steps", [1, 4, 9])
def test_flow_match_euler_zimage_schedule_matches_diffusers(num_steps):
    theirs = diffusers.FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    theirs.set_timesteps(sigmas=linear_sigmas(num_steps), mu=0.7)  # mu unused without dynamic shifting
    theirs.set_begin_index(0)
    ours = FlowMatchEulerSampler(num_steps, shift=3.0, sigmas=linear_sigmas(num_steps))
    assert torch.equal(ours.sigmas, theirs.sigmas)
    _run_both(ours, theirs, theirs.timesteps)


def test_flow_match_euler_default_and_dynamic_schedules_match_diffusers():
    theirs = diffusers.FlowMatchEulerDiscreteScheduler(shift=2.5)
    theirs.set_timesteps(6)
    theirs.set_begin_index(0)
    _run_both(FlowMatchEulerSampler(6, shift=2.5), theirs, theirs.timesteps)
    dynamic = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    dynamic.set_timesteps(5, mu=1.1)
    dynamic.set_begin_index(0)
    _run_both(FlowMatchEulerSampler(5, mu=1.1), dynamic, dynamic.timesteps)


def test_sampler_refuses_extra_steps_and_bad_settings():
    sampler = FlowMatchEulerSampler(1)
    sampler.step(torch.zeros(2), torch.zeros(2))
    with pytest.raises(RuntimeError):
        sampler.step(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError):
        UniPCSampler(0)
    with pytest.raises(ValueError):
        FlowMatchEulerSampler(3, sigmas=[1.0, 0.5])


def test_seeded_noise_matches_diffusers_randn_tensor():
    from diffusers.utils.torch_utils import randn_tensor

    theirs = randn_tensor((1, 4, 3, 8, 8), generator=torch.Generator("cpu").manual_seed(42))
    ours = seeded_noise((4, 3, 8, 8), 42)
    assert torch.equal(ours, theirs[0])
    assert not torch.equal(ours, seeded_noise((4, 3, 8, 8), 43))
