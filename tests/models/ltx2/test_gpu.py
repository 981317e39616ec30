"""Real-size LTX-2 on the GPU, seeded random bf16 weights shared with diffusers' modules: our packed
DiT (both streams) and our video VAE decoder, audio decoder and vocoder against diffusers'."""

import pytest
import torch

from mstar.models.checkpoint import build_module
from mstar.models.ltx2 import geometry, weights
from mstar.models.ltx2.config import to_json_dict
from mstar.models.ltx2.dit import DiTInput, LTX2DiT
from mstar.models.ltx2.presets import LTX2
from tests.models.ltx2.reference import diffusers_forward

MAX_RELATIVE_ERROR = 2e-2
DEVICE, DTYPE = "cuda", torch.bfloat16


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm())


def _item(generator, num_frames, height, width, timestep, **kwargs) -> DiTInput:
    video = geometry.video_geometry(num_frames, height, width, 24.0, LTX2)
    audio = geometry.audio_geometry(num_frames, 24.0, LTX2)
    c = LTX2.dit
    text_len = LTX2.defaults.max_sequence_length  # what the connectors give with registers

    def randn(*shape):
        return torch.randn(shape, generator=generator, device=DEVICE)

    return DiTInput(
        randn(*video.latent_shape),
        randn(*audio.latent_shape),
        timestep,
        randn(text_len, c.caption_channels).to(DTYPE),
        randn(text_len, c.caption_channels).to(DTYPE),
        frame_rate=24.0,
        **kwargs,
    )


@pytest.mark.gpu
def test_real_size_dit_matches_diffusers_in_bf16():
    diffusers = pytest.importorskip("diffusers")
    from mstar.engine.attention import build_attention

    ours = build_module(lambda: LTX2DiT(LTX2.dit), DEVICE, DTYPE, seed=0)
    with torch.device("meta"):
        theirs = diffusers.LTX2VideoTransformer3DModel(**to_json_dict(LTX2.dit))
    theirs.load_state_dict(ours.state_dict(), strict=True, assign=True)  # the same tensors, no copy
    theirs.eval().requires_grad_(False)

    generator = torch.Generator(DEVICE).manual_seed(0)
    request = _item(generator, 121, 512, 768, 700.0)  # the pipeline's default size and length
    uncond = DiTInput(**{**request.__dict__, "video_text": _item(generator, 9, 64, 64, 0.0).video_text})
    isolated = DiTInput(**{**request.__dict__, "isolated": True})
    other = _item(generator, 49, 704, 1280, 300.0, num_clean_frames=1)  # another request: 1280x704, I2V
    items = [request, uncond, isolated, other]

    attention = build_attention("auto", DEVICE, DTYPE)
    with torch.inference_mode():
        packed = ours(items, attention)
        for index, (item, (video, audio)) in enumerate(zip(items, packed, strict=True)):
            ref_video, ref_audio = diffusers_forward(theirs, item)
            video_error, audio_error = _relative_error(video, ref_video), _relative_error(audio, ref_audio)
            print(f"item {index}: video {video_error:.2e} audio {audio_error:.2e} ({attention.backend_name})")
            assert video_error <= MAX_RELATIVE_ERROR and audio_error <= MAX_RELATIVE_ERROR


@pytest.mark.gpu
def test_real_size_decoders_match_diffusers_in_bf16():
    diffusers = pytest.importorskip("diffusers")
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder as TheirVocoder

    vae = weights.build_video_vae(LTX2.vae, DEVICE, DTYPE, encoder=False)
    audio = weights.build_audio_decoder(LTX2.audio_vae, DEVICE, DTYPE)
    vocoder = weights.build_vocoder(LTX2.vocoder, DEVICE, DTYPE)
    with torch.device("meta"):
        their_vae = diffusers.AutoencoderKLLTX2Video(**to_json_dict(LTX2.vae))
        their_audio = diffusers.AutoencoderKLLTX2Audio(**to_json_dict(LTX2.audio_vae))
        their_vocoder = TheirVocoder(**to_json_dict(LTX2.vocoder))
    their_vae.load_state_dict(vae.state_dict(), strict=False, assign=True)  # the decoder half
    their_audio.load_state_dict(audio.state_dict(), strict=False, assign=True)
    their_vocoder.load_state_dict(vocoder.state_dict(), strict=True, assign=True)

    generator = torch.Generator(DEVICE).manual_seed(1)
    video_geo = geometry.video_geometry(33, 512, 768, 24.0, LTX2)
    audio_geo = geometry.audio_geometry(121, 24.0, LTX2)
    latents = torch.randn((1, *video_geo.latent_shape), generator=generator, device=DEVICE).to(DTYPE)
    audio_latents = torch.randn((1, *audio_geo.latent_shape), generator=generator, device=DEVICE).to(DTYPE)
    with torch.inference_mode():
        frames = vae.decode(latents)
        expected = their_vae.decoder(latents, None, causal=LTX2.vae.decoder_causal)
        assert _relative_error(frames, expected) <= MAX_RELATIVE_ERROR
        mel = audio.decode(audio_latents)
        assert _relative_error(mel, their_audio.decoder(audio_latents)) <= MAX_RELATIVE_ERROR
        waveform = vocoder(mel)
        assert waveform.shape == (1, 2, audio_geo.num_samples)
        assert _relative_error(waveform, their_vocoder(mel)) <= MAX_RELATIVE_ERROR
