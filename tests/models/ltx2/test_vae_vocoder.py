"""Our LTX-2 video VAE, audio VAE decoder and vocoder against diffusers' (tiny configs, fp32, CPU)."""

from dataclasses import replace

import pytest
import torch

from mstar.models.ltx2.audio_vae import LTX2AudioDecoder
from mstar.models.ltx2.presets import TINY
from mstar.models.ltx2.video_vae import LTX2VideoVAE
from mstar.models.ltx2.vocoder import LTX2Vocoder
from tests.models.ltx2.reference import snr_db
from tests.models.ltx2.tiny_parts import tiny_audio_vae, tiny_video_vae, tiny_vocoder

pytest.importorskip("diffusers")

MIN_SNR_DB = 60.0

VIDEO_VARIANTS = {
    "ltx2": TINY.vae,
    "timestep-conditioned": replace(TINY.vae, timestep_conditioning=True),
    "causal-decoder": replace(
        TINY.vae,
        decoder_causal=True,
        downsample_type=("spatial", "spatiotemporal"),
        upsample_residual=(False, True),
        upsample_factor=(1, 2),
        decoder_block_out_channels=(16, 16),
    ),
}


@pytest.fixture(scope="module", params=list(VIDEO_VARIANTS))
def video_vaes(request):
    config = VIDEO_VARIANTS[request.param]
    theirs = tiny_video_vae(replace(TINY, vae=config))
    ours = LTX2VideoVAE(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def test_video_decode_matches_diffusers(video_vaes):
    ours, theirs = video_vaes
    latents = torch.randn(1, TINY.vae.latent_channels, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    timestep = torch.tensor([0.05])
    with torch.no_grad():
        video = ours.decode(ours.denormalize(latents), timestep)
        reference = theirs.decode(
            latents * theirs.latents_std.view(1, -1, 1, 1, 1) + theirs.latents_mean.view(1, -1, 1, 1, 1),
            timestep if theirs.config.timestep_conditioning else None,
            return_dict=False,
        )[0]
    assert video.shape == reference.shape == (1, 3, 9, 32, 40)
    assert snr_db(video, reference) >= MIN_SNR_DB


def test_the_decoder_gets_the_latents_the_pipeline_gives_it_in_bf16():
    """LTX2Pipeline casts its final latents to the prompt embeddings' dtype (bf16 on a GPU) and
    denormalizes them in it; ours hands the decoder that same bf16 tensor."""
    from diffusers import LTX2Pipeline as TheirPipeline

    from mstar.models.ltx2.pipeline import LTX2Pipeline

    generator = torch.Generator().manual_seed(2)
    vae = LTX2VideoVAE(TINY.vae, encoder=False).to(torch.bfloat16).eval()
    vae.latents_mean.copy_(torch.randn(TINY.vae.latent_channels, generator=generator))
    vae.latents_std.copy_(torch.rand(TINY.vae.latent_channels, generator=generator) + 0.5)
    decoded = []
    decode = vae.decode
    vae.decode = lambda latents, timestep=None: decoded.append(latents) or decode(latents, timestep)
    latents = torch.randn(TINY.vae.latent_channels, 1, 2, 2, generator=generator)
    frames = LTX2Pipeline(TINY, "cpu", torch.bfloat16, vae=vae).decode(latents)
    expected = TheirPipeline._denormalize_latents(
        latents[None].to(torch.bfloat16), vae.latents_mean, vae.latents_std, TINY.vae.scaling_factor
    )
    assert torch.equal(decoded[0], expected)
    assert frames.dtype == torch.uint8 and frames.shape[0] == 1


def test_video_encode_of_the_first_frame_matches_diffusers(video_vaes):
    ours, theirs = video_vaes
    image = torch.rand(1, 3, 1, 32, 48, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        latents = ours.normalize(ours.encode(image))
        mean = theirs.encode(image).latent_dist.mode()
        reference = (mean - theirs.latents_mean.view(1, -1, 1, 1, 1)) / theirs.latents_std.view(
            1, -1, 1, 1, 1
        )
    assert latents.shape == reference.shape == (1, TINY.vae.latent_channels, 1, 4, 6)
    assert snr_db(latents, reference) >= MIN_SNR_DB


def test_a_timestep_conditioned_decoder_needs_the_timestep():
    vae = LTX2VideoVAE(VIDEO_VARIANTS["timestep-conditioned"]).eval()
    with pytest.raises(ValueError, match="timestep"):
        vae.decode(torch.zeros(1, TINY.vae.latent_channels, 1, 2, 2))


def test_noise_injecting_decoders_are_refused():
    with pytest.raises(ValueError, match="inject_noise"):
        LTX2VideoVAE(replace(TINY.vae, decoder_inject_noise=(True, False, False)))


AUDIO_VARIANTS = {
    "ltx2": TINY.audio_vae,
    "attention-width-causal": replace(
        TINY.audio_vae,
        attn_resolutions=(16, 32),
        mid_block_add_attention=True,
        causality_axis="width",
        ch_mult=(1, 2, 2),
    ),
}


@pytest.mark.parametrize("variant", list(AUDIO_VARIANTS))
def test_audio_decode_matches_diffusers(variant):
    config = AUDIO_VARIANTS[variant]
    theirs = tiny_audio_vae(replace(TINY, audio_vae=config))
    ours = LTX2AudioDecoder(config).eval()
    ours.load_state_dict(
        {k: v for k, v in theirs.state_dict().items() if not k.startswith("encoder.")}, strict=True
    )
    generator = torch.Generator().manual_seed(2)
    latents = torch.randn(1, config.latent_channels, 7, config.latent_mel_bins, generator=generator)
    with torch.no_grad():
        mel = ours.decode(ours.denormalize(latents))
        packed = latents.transpose(1, 2).flatten(2)  # the pipeline's [B, L, C * M] normalisation
        packed = packed * theirs.latents_std + theirs.latents_mean
        reference = theirs.decode(
            packed.unflatten(2, (config.latent_channels, -1)).transpose(1, 2), return_dict=False
        )[0]
    assert mel.shape == reference.shape == (1, 2, 4 * 7 - 3, config.mel_bins)
    assert snr_db(mel, reference) >= MIN_SNR_DB
    assert torch.allclose(ours.normalize(ours.denormalize(latents)), latents, atol=1e-6)


VOCODER_VARIANTS = {
    "ltx2": TINY.vocoder,
    "snakebeta-antialiased": replace(
        TINY.vocoder, act_fn="snakebeta", antialias=True, final_act_fn=None, final_bias=False,
        resnet_kernel_sizes=(3, 7), resnet_dilations=((1, 3, 5), (1, 3, 5)),
    ),
}  # fmt: skip


@pytest.mark.parametrize("variant", list(VOCODER_VARIANTS))
def test_vocoder_matches_diffusers(variant):
    config = VOCODER_VARIANTS[variant]
    theirs = tiny_vocoder(replace(TINY, vocoder=config))
    ours = LTX2Vocoder(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    mel = torch.randn(1, 2, 25, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        waveform, reference = ours(mel), theirs(mel)
    assert waveform.shape == reference.shape == (1, 2, 25 * config.samples_per_mel_frame)
    assert snr_db(waveform, reference) >= MIN_SNR_DB
