"""Our AutoencoderKLFlux2 decoder and encoder (with the latent batch-norm and 2x2 patchify) against
the pipeline's own decode and reference-encode paths, and reference-image preparation against
the pipeline's preprocessing (tiny config, fp32, CPU)."""

import numpy as np
import pytest
import torch

from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.geometry import reference_pixel_size
from mstar.models.flux2_klein.references import prepare_reference
from mstar.models.flux2_klein.vae import patchify, unpatchify
from mstar.models.flux2_klein.weights import build_vae_decoder, build_vae_encoder

VAE_SCALE = TINY.vae.spatial_scale


@pytest.fixture(scope="module")
def vaes(tiny_folder):
    folder, pipe = tiny_folder
    decoder = build_vae_decoder(TINY.vae, "cpu", torch.float32, model_path=str(folder))
    encoder = build_vae_encoder(TINY.vae, "cpu", torch.float32, model_path=str(folder))
    return decoder, encoder, pipe


def pipeline_decode(pipe, latents: torch.Tensor) -> torch.Tensor:
    """The end of Flux2KleinPipeline.__call__: batch-norm denormalise, unpatchify, vae.decode."""
    mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(pipe.vae.bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
    with torch.no_grad():
        return pipe.vae.decode(pipe._unpatchify_latents(latents * std + mean), return_dict=False)[0]


def test_patchify_is_the_pipelines_and_inverts():
    x = torch.randn(2, 4, 6, 10)
    assert torch.equal(patchify(x), _pipeline_class()._patchify_latents(x))
    assert torch.equal(unpatchify(patchify(x)), x)


def _pipeline_class():
    from diffusers import Flux2KleinPipeline

    return Flux2KleinPipeline


def test_decode_matches_pipeline(vaes):
    decoder, _, pipe = vaes
    latents = torch.randn(1, TINY.transformer.in_channels, 5, 7, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = decoder.decode(latents)
    expected = pipeline_decode(pipe, latents)
    assert ours.shape == (1, 3, 5 * 2 * VAE_SCALE, 7 * 2 * VAE_SCALE)
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-5)
    frames = decoder.decode_frames(latents[0])
    assert frames.dtype == torch.uint8 and frames.shape == (1, 40, 56, 3)


def test_encode_matches_pipeline_reference_latents(vaes):
    _, encoder, pipe = vaes
    image = torch.rand(1, 3, 48, 64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        ours = encoder.encode(image)
        expected = pipe._encode_vae_image(image, generator=None)
    assert ours.shape == (1, TINY.transformer.in_channels, 48 // (2 * VAE_SCALE), 64 // (2 * VAE_SCALE))
    assert torch.allclose(ours, expected, rtol=1e-5, atol=1e-5)


def test_encoder_and_decoder_read_only_their_half(tiny_folder):
    decoder_keys = build_vae_decoder(TINY.vae, "cpu", torch.float32).state_dict()
    encoder_keys = build_vae_encoder(TINY.vae, "cpu", torch.float32).state_dict()
    assert not any(k.startswith(("encoder.", "quant_conv.")) for k in decoder_keys)
    assert not any(k.startswith(("decoder.", "post_quant_conv.")) for k in encoder_keys)
    random = build_vae_decoder(TINY.vae, "cpu", torch.float32, seed=3)
    assert torch.equal(random.bn.running_var, torch.ones_like(random.bn.running_var))


def pipeline_reference(pipe, image):
    """Flux2KleinPipeline.__call__'s step 4 for one reference image."""
    pipe.image_processor.check_image_input(image)
    width, height = image.size
    if width * height > 1024 * 1024:
        image = pipe.image_processor._resize_to_target_area(image, 1024 * 1024)
        width, height = image.size
    multiple_of = pipe.vae_scale_factor * 2
    width, height = (width // multiple_of) * multiple_of, (height // multiple_of) * multiple_of
    return pipe.image_processor.preprocess(image, height=height, width=width, resize_mode="crop")[0]


@pytest.mark.parametrize("size", [(72, 100), (1100, 1000), (64, 500)])
def test_prepare_reference_matches_pipeline(tiny_folder, size):
    from PIL import Image

    _, pipe = tiny_folder
    pixels = np.random.default_rng(size[0]).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    ours = prepare_reference(image, vae_scale=VAE_SCALE)
    expected = pipeline_reference(pipe, image)
    assert ours.shape == expected.shape
    assert (ours.shape[2], ours.shape[1]) == reference_pixel_size(*size, vae_scale=VAE_SCALE)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("size", [(63, 200), (64, 513)])
def test_prepare_reference_refuses_what_the_pipeline_refuses(tiny_folder, size):
    from PIL import Image

    _, pipe = tiny_folder
    image = Image.new("RGB", size)
    with pytest.raises(ValueError):
        pipe.image_processor.check_image_input(image)
    with pytest.raises(ValueError, match="image is"):
        prepare_reference(image)


def test_prepare_reference_takes_decoded_uint8_arrays():
    from PIL import Image

    pixels = np.random.default_rng(3).integers(0, 256, size=(70, 90, 3), dtype=np.uint8)
    assert torch.equal(prepare_reference(pixels), prepare_reference(Image.fromarray(pixels)))
