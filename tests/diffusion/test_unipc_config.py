"""UniPCSampler.from_config(UniPCConfig) against diffusers' UniPCMultistepScheduler built from the
same scheduler_config: Karras flow sigmas, the native flow schedule, a recipe's flow shift."""

import numpy as np
import pytest
import torch

from mstar.diffusion.samplers import UniPCSampler, native_flow_sigmas
from mstar.diffusion.scheduler_config import UniPCConfig
from tests.diffusion.test_samplers import WAN_UNIPC_CONFIG, _run_both

diffusers = pytest.importorskip("diffusers")

KARRAS_CONFIG = {
    **WAN_UNIPC_CONFIG,
    "flow_shift": 1.0,
    "use_karras_sigmas": True,
    "sigma_min": 0.147,
    "sigma_max": 200.0,
}


def _theirs(raw: dict, num_steps: int, native: bool):
    scheduler = diffusers.UniPCMultistepScheduler.from_config(raw)
    if native:
        sigmas = np.linspace(1.0 - 1.0 / scheduler.config.num_train_timesteps, 0.0, num_steps + 1)[:-1]
        scheduler.set_timesteps(num_steps, sigmas=sigmas)
    else:
        scheduler.set_timesteps(num_steps)
    return scheduler


@pytest.mark.parametrize("native", [False, True], ids=["default", "native"])
@pytest.mark.parametrize("raw", [WAN_UNIPC_CONFIG, KARRAS_CONFIG], ids=["shifted", "karras"])
@pytest.mark.parametrize("num_steps", [1, 4, 20])
def test_from_config_steps_like_diffusers(raw, native, num_steps):
    config = UniPCConfig.from_dict(raw)
    sigmas = native_flow_sigmas(num_steps) if native else None
    ours = UniPCSampler.from_config(config, num_steps, sigmas)
    theirs = _theirs(raw, num_steps, native)
    assert torch.equal(ours.sigmas, theirs.sigmas)
    _run_both(ours, theirs, theirs.timesteps)


def test_a_recipe_flow_shift_replaces_the_karras_spacing():
    shifted = UniPCConfig.from_dict(KARRAS_CONFIG).with_flow_shift(12.0)
    assert not shifted.use_karras_sigmas and shifted.flow_shift == 12.0
    raw = {**KARRAS_CONFIG, "flow_shift": 12.0, "use_karras_sigmas": False}
    ours = UniPCSampler.from_config(shifted, 6, native_flow_sigmas(6))
    theirs = _theirs(raw, 6, native=True)
    assert torch.equal(ours.sigmas, theirs.sigmas)
    _run_both(ours, theirs, theirs.timesteps)


@pytest.mark.parametrize(
    ("key", "value"),
    [("prediction_type", "epsilon"), ("use_dynamic_shifting", True), ("final_sigmas_type", "sigma_min"),
     ("use_beta_sigmas", True), ("thresholding", True)],
)  # fmt: skip
def test_settings_we_do_not_implement_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=key):
        UniPCConfig.from_dict({**WAN_UNIPC_CONFIG, key: value})


def test_unknown_keys_and_missing_flow_settings_are_refused():
    with pytest.raises(ValueError, match="unknown key 'warp'"):
        UniPCConfig.from_dict({**WAN_UNIPC_CONFIG, "warp": 1})
    with pytest.raises(ValueError, match="flow matching"):
        UniPCConfig.from_dict({"num_train_timesteps": 1000})
    with pytest.raises(ValueError, match="sigma_min"):
        UniPCConfig.from_dict({**WAN_UNIPC_CONFIG, "use_karras_sigmas": True})


def test_one_config_type_reads_every_family_folder():
    """Wan2.2's published scheduler_config.json gives Wan's built-in default, through the same
    type Cosmos3 reads; a file of another scheduler class is refused."""
    from mstar.models.wan22.config import WAN22_SCHEDULER_CONFIG, Wan22Config

    assert UniPCConfig.from_dict(WAN22_SCHEDULER_CONFIG) == Wan22Config().scheduler
    with pytest.raises(ValueError, match="FlowMatchEulerDiscreteScheduler"):
        UniPCConfig.from_dict({**WAN_UNIPC_CONFIG, "_class_name": "FlowMatchEulerDiscreteScheduler"})
