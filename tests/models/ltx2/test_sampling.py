"""LTX-2's sampler setup and guidance against LTX2Pipeline's scheduler setup and guidance code, and
the geometry formulas against the pipeline's shapes."""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from mstar.diffusion.samplers import FlowMatchEulerSampler
from mstar.models.ltx2 import geometry
from mstar.models.ltx2.presets import LTX2, TINY
from mstar.models.ltx2.sampling import (
    StreamGuidance,
    guide,
    initial_noise,
    make_sampler,
    resolve_audio_scales,
)
from tests.models.ltx2.tiny_parts import tiny_scheduler

diffusers = pytest.importorskip("diffusers")


def _pipeline_schedule(num_steps: int, num_tokens: int):
    """What LTX2Pipeline.__call__ does to its scheduler (and the audio copy) before the loop."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps

    scheduler = tiny_scheduler(LTX2)
    sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
    mu = calculate_shift(
        num_tokens,
        scheduler.config.get("base_image_seq_len", 1024),
        scheduler.config.get("max_image_seq_len", 4096),
        scheduler.config.get("base_shift", 0.95),
        scheduler.config.get("max_shift", 2.05),
    )
    audio_scheduler = copy.deepcopy(scheduler)
    retrieve_timesteps(audio_scheduler, num_steps, "cpu", None, sigmas=sigmas, mu=mu)
    retrieve_timesteps(scheduler, num_steps, "cpu", None, sigmas=sigmas, mu=mu)
    scheduler.set_begin_index(0)
    audio_scheduler.set_begin_index(0)
    return scheduler, audio_scheduler, mu


@pytest.mark.parametrize(("num_steps", "num_tokens"), [(2, 256), (8, 1024), (30, 6144), (40, 14080)])
def test_schedule_equals_the_pipelines(num_steps, num_tokens):
    theirs, audio_theirs, mu = _pipeline_schedule(num_steps, num_tokens)
    ours = make_sampler(num_steps, num_tokens, LTX2.scheduler)
    assert ours.mu == pytest.approx(mu, rel=0, abs=1e-12)
    assert torch.equal(ours.timesteps, theirs.timesteps)
    assert torch.equal(ours.sigmas, theirs.sigmas)
    assert torch.equal(ours.sigmas, audio_theirs.sigmas)
    assert float(ours.sigmas[-2]) == pytest.approx(LTX2.scheduler.shift_terminal, abs=1e-6)


def test_one_step_is_refused_where_the_pipeline_makes_nan():
    with pytest.warns(RuntimeWarning):
        theirs, _, _ = _pipeline_schedule(1, 256)
    assert torch.isnan(theirs.sigmas[0])
    with pytest.raises(ValueError, match=">= 2"):
        make_sampler(1, 256, LTX2.scheduler)


def test_steps_equal_the_pipelines_scheduler():
    theirs, _, _ = _pipeline_schedule(6, 3000)
    ours = make_sampler(6, 3000, LTX2.scheduler)
    generator = torch.Generator().manual_seed(0)
    ours_sample = torch.randn(2, 3, 4, 5, generator=generator)
    theirs_sample = ours_sample.clone()
    for step, t in enumerate(theirs.timesteps):
        velocity = torch.tanh(ours_sample * (1 + 0.1 * step))
        ours_sample = ours.step(velocity, ours_sample)
        theirs_sample = theirs.step(
            torch.tanh(theirs_sample * (1 + 0.1 * step)), t, theirs_sample, return_dict=False
        )[0]
        assert torch.equal(ours_sample, theirs_sample)
    assert ours.done


def test_shift_terminal_stretches_any_schedule():
    from diffusers import FlowMatchEulerDiscreteScheduler

    theirs = FlowMatchEulerDiscreteScheduler(shift=3.0, shift_terminal=0.2)
    theirs.set_timesteps(7)
    ours = FlowMatchEulerSampler(7, shift=3.0, shift_terminal=0.2)
    assert torch.allclose(ours.sigmas, theirs.sigmas, atol=1e-7)


def _pipeline_guidance(latents, velocities, sigma, scales: StreamGuidance):
    """The body of LTX2Pipeline's loop between the transformer and scheduler.step, for one stream."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

    def x0(v):
        return latents - v * sigma

    cond = x0(velocities["cond"])
    cfg = (scales.guidance_scale - 1) * (cond - x0(velocities["uncond"]))
    stg = scales.stg_scale * (cond - x0(velocities["perturbed"]))
    modality = (scales.modality_scale - 1) * (cond - x0(velocities["isolated"]))
    guided = cond + cfg + stg + modality
    if scales.guidance_rescale > 0:
        guided = rescale_noise_cfg(guided, cond, guidance_rescale=scales.guidance_rescale)
    return (latents - guided) / sigma


@pytest.mark.parametrize("rescale", [0.0, 0.7])
def test_guidance_equals_the_pipelines(rescale):
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 12, 8, generator=generator)  # packed [B, S, C], as the pipeline holds it
    velocities = {
        label: torch.randn(1, 12, 8, generator=generator)
        for label in ("cond", "uncond", "perturbed", "isolated")
    }
    sigma = torch.tensor(0.62)
    scales = StreamGuidance(3.0, 1.0, 3.0, rescale)
    ours = guide(latents[0], sigma, {k: v[0] for k, v in velocities.items()}, scales)
    theirs = _pipeline_guidance(latents, velocities, sigma, scales)[0]
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)


def test_audio_scales_fall_back_to_the_videos_as_the_pipeline_does():
    video = StreamGuidance(3.0, 1.0, 3.0, 0.7)
    assert resolve_audio_scales(video, StreamGuidance(0.0, 0.0, 0.0, 0.0)) == video
    assert resolve_audio_scales(video, StreamGuidance(7.0, 2.0, 3.0, 0.5)) == StreamGuidance(
        7.0, 2.0, 3.0, 0.5
    )


def test_initial_noise_is_the_pipelines_draw():
    from diffusers.utils.torch_utils import randn_tensor

    video_shape, audio_shape = (1, 8, 3, 8, 8), (1, 2, 28, 4)
    generator = torch.Generator("cpu").manual_seed(11)
    theirs_video = randn_tensor(
        video_shape, generator=generator, device=torch.device("cpu"), dtype=torch.float32
    )
    theirs_audio = randn_tensor(
        audio_shape, generator=generator, device=torch.device("cpu"), dtype=torch.float32
    )
    video, audio = initial_noise(11, video_shape, audio_shape)
    assert torch.equal(video, theirs_video) and torch.equal(audio, theirs_audio)


class _Drawn(Exception):
    """Stops a pipeline call once its initial noise is drawn."""


@pytest.mark.parametrize("image_to_video", [False, True])
def test_a_bf16_pipeline_draws_float32_noise_from_the_cpu_generator(tiny_folder, monkeypatch, image_to_video):
    """The pipelines in bf16 (as a GPU runs them) draw the video and then the audio noise in float32
    from the CPU generator, as initial_noise does: a bf16 draw would not be the float32 one rounded
    in every torch release (torch 2.11's differ), so a dtype that followed the model would break
    seeded parity there alone."""
    import diffusers.pipelines.ltx2.pipeline_ltx2 as t2v
    import diffusers.pipelines.ltx2.pipeline_ltx2_image2video as i2v
    from PIL import Image

    folder, _ = tiny_folder
    module, cls = (i2v, i2v.LTX2ImageToVideoPipeline) if image_to_video else (t2v, t2v.LTX2Pipeline)
    pipe = cls.from_pretrained(str(folder), dtype=torch.bfloat16)
    draws = []

    def spy(shape, generator=None, device=None, dtype=None, **_):
        draws.append((tuple(shape), dtype, generator.device.type))
        if len(draws) == 2:
            raise _Drawn
        return torch.zeros(shape, dtype=dtype)

    monkeypatch.setattr(module, "randn_tensor", spy)
    extra = {"image": Image.new("RGB", (64, 64))} if image_to_video else {}
    with pytest.raises(_Drawn), torch.no_grad():
        pipe(prompt="a", height=64, width=64, num_frames=9, frame_rate=8.0, num_inference_steps=2,
             generator=torch.Generator("cpu").manual_seed(0), max_sequence_length=16, **extra)  # fmt: skip
    video = geometry.video_geometry(9, 64, 64, 8.0, TINY)
    audio = geometry.audio_geometry(9, 8.0, TINY)
    assert draws == [
        ((1, *video.latent_shape), torch.float32, "cpu"),
        ((1, *audio.latent_shape), torch.float32, "cpu"),
    ]
    ours = initial_noise(0, video.latent_shape, audio.latent_shape)
    assert all(noise.dtype == torch.float32 and noise.device.type == "cpu" for noise in ours)


def test_geometry_of_the_released_model():
    video = geometry.video_geometry(121, 512, 768, 24.0, LTX2)
    assert video.latent_shape == (128, 16, 16, 24)
    assert geometry.num_video_tokens(video, LTX2.dit) == 16 * 16 * 24
    assert geometry.decoded_frames(video.latent_frames, LTX2.vae) == 121
    audio = geometry.audio_geometry(121, 24.0, LTX2)
    assert audio.latent_shape == (8, 126, 16)  # round(121 / 24 * 25)
    assert geometry.num_audio_tokens(audio) == 126
    assert audio.mel_frames == 4 * 126 - 3 and audio.num_samples == audio.mel_frames * 240
    assert audio.sample_rate == 24000
    assert abs(audio.duration_s - video.duration_s) < 4 * 240 / 24000  # within 4 mel frames
    assert geometry.muxed_audio_samples(121, 24.0, LTX2.vocoder) == round(121 / 24 * 24000)
    assert geometry.frames_are_valid(121, LTX2.vae) and not geometry.frames_are_valid(120, LTX2.vae)
    gemm, attention = geometry.forward_flops(LTX2.dit, 6144, 126, 1024)
    assert 100e12 < gemm < 300e12 and attention > 0


def test_geometry_matches_the_pipelines_latents(tiny_folder):
    """The latent shapes the tiny pipeline makes, from its own prepare_* code."""
    _, pipe = tiny_folder
    video = geometry.video_geometry(17, 64, 96, 8.0, TINY)
    latents = pipe.prepare_latents(
        1, TINY.dit.in_channels, 64, 96, 17, 0.0, torch.float32, "cpu", torch.Generator()
    )
    assert latents.shape == (1, geometry.num_video_tokens(video, TINY.dit), TINY.dit.in_channels)
    audio = geometry.audio_geometry(17, 8.0, TINY)
    duration = 17 / 8.0
    per_second = (
        pipe.audio_sampling_rate / pipe.audio_hop_length / float(pipe.audio_vae_temporal_compression_ratio)
    )
    assert audio.latent_frames == round(duration * per_second)


def test_guidance_labels_follow_the_pipelines_rules():
    labels = geometry.guidance_labels(3.0, 7.0, 1.0, 1.0, 3.0, 3.0, (28,), LTX2.dit)
    assert labels == (geometry.COND, geometry.UNCOND, geometry.ISOLATED)  # LTX-2 ignores the perturbation
    perturbed_dit = replace(LTX2.dit, perturbed_attn=True)
    assert geometry.PERTURBED in geometry.guidance_labels(3.0, 7.0, 1.0, 1.0, 3.0, 3.0, (28,), perturbed_dit)
    assert geometry.guidance_labels(1.0, 1.0, 0.0, 0.0, 1.0, 1.0, (), perturbed_dit) == (geometry.COND,)
    assert geometry.guidance_labels(1.0, 7.0, 0.0, 0.0, 1.0, 1.0, (), LTX2.dit) == (
        geometry.COND,
        geometry.UNCOND,
    )
    assert geometry.step_tokens(6144, 126, 3) == 3 * 6270
