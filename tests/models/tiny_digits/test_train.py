"""Training: its flow convention is the sampler's, and a seeded run is reproducible."""

import torch

from mstar.diffusion.samplers import FlowMatchEulerSampler, linear_sigmas
from mstar.models.tiny_digits import data, flow
from mstar.models.tiny_digits.config import TinyDigitsConfig
from mstar.models.tiny_digits.train import Trainer, TrainSettings


def test_training_target_walks_back_to_the_data_in_sampler_steps():
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn(6, 1, 1, 16, 16, generator=generator)
    x_sigma, timesteps, velocity = flow.noisy_sample(x0, generator, shift=1.0)
    sigmas = (timesteps / 1000).view(6, 1, 1, 1, 1)
    # one Euler step from sigma to 0 along the training target lands on the data
    torch.testing.assert_close(x_sigma - sigmas * velocity, x0)
    # and the sampler, fed that velocity, goes from pure noise (sigma 1) to the data
    noise = velocity + x0
    sampler = FlowMatchEulerSampler(5, shift=1.0, sigmas=linear_sigmas(5))
    assert float(sampler.timesteps[0]) == 1000.0
    sample = noise
    while not sampler.done:
        sample = sampler.step(noise - x0, sample)
    torch.testing.assert_close(sample, x0, atol=1e-5, rtol=1e-5)


def short_run(seed: int) -> dict[str, torch.Tensor]:
    train_split, _ = data.load_splits()
    images = data.upscale_to_model(train_split.images_8px[:16], 16)
    labels = torch.from_numpy(train_split.labels[:16])
    trainer = Trainer(TinyDigitsConfig(), TrainSettings(num_steps=2, batch_size=4, seed=seed, log_every=1))
    trainer.fit(images, labels)
    return trainer.ema_dit.state_dict()


def test_seeded_training_is_reproducible():
    torch.set_num_threads(1)
    first, second, other = short_run(0), short_run(0), short_run(1)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["proj_out.weight"], other["proj_out.weight"])
