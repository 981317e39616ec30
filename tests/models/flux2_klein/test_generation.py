"""A tiny end-to-end denoise: our text encoder, VAE encoder, packed DiT, sampler and VAE decoder
driven by a test-local loop, against Flux2KleinPipeline.from_pretrained on the same tiny folder
(text-to-image with classifier-free guidance on the base checkpoint, an edit with two reference
images on the distilled one)."""

import numpy as np
import pytest
import torch

from mstar.diffusion.noise import seeded_noise
from mstar.engine.attention import build_attention
from mstar.models.flux2_klein import geometry
from mstar.models.flux2_klein.config import TINY, load_config
from mstar.models.flux2_klein.dit import DiTInput
from mstar.models.flux2_klein.references import prepare_reference
from mstar.models.flux2_klein.schedule import make_sampler
from mstar.models.flux2_klein.vae import unpatchify
from mstar.models.flux2_klein.weights import build_dit, build_vae_decoder, build_vae_encoder
from tests.models.flux2_klein.test_text_encoder import load_encoder
from tests.models.flux2_klein.tiny_parts import pipeline_call_kwargs

MIN_PSNR_DB = 40.0


def psnr_db(ours: torch.Tensor, reference: torch.Tensor, peak: float = 1.0) -> float:
    error = (ours.double() - reference.double()).pow(2).mean().item()
    return float("inf") if error == 0 else 10 * np.log10(peak**2 / error)


def latent_psnr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return psnr_db(ours, reference, peak=reference.abs().max().item())


def reference_images():
    from PIL import Image

    rng = np.random.default_rng(7)
    sizes = [(64, 80), (96, 64)]  # (width, height): 8 x 10 and 12 x 8 tokens at the tiny VAE's scale
    return [Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)) for w, h in sizes]


class OurPipeline:
    """Our pieces, wired the way a serving pipeline would wire them (one request, no batching)."""

    def __init__(self, folder, is_distilled: bool):
        config = load_config(folder, TINY)
        self.config = config
        self.is_distilled = is_distilled
        self.encoder = load_encoder(folder)
        self.dit = build_dit(config.transformer, "cpu", torch.float32, model_path=str(folder))
        self.vae_encoder = build_vae_encoder(config.vae, "cpu", torch.float32, model_path=str(folder))
        self.vae_decoder = build_vae_decoder(config.vae, "cpu", torch.float32, model_path=str(folder))
        self.attn = build_attention("torch", "cpu", torch.float32)

    @torch.no_grad()
    def __call__(self, prompt, num_steps, guidance_scale, seed, height=None, width=None, images=()):
        vae_scale = self.config.vae.spatial_scale
        references = [
            self.vae_encoder.encode(prepare_reference(image, vae_scale)[None])[0] for image in images
        ]
        if height is None:
            height, width = geometry.default_output_size([image.size for image in images])
        rows, cols = geometry.latent_grid(height, width, vae_scale)
        labels = geometry.guidance_labels(guidance_scale, self.is_distilled)
        texts = self.encoder.encode([prompt, ""][: len(labels)])  # the pipeline's negative prompt is ""
        latents = seeded_noise([self.config.transformer.in_channels, rows, cols], seed)
        sampler = make_sampler(self.config.scheduler, num_steps, rows * cols)
        while not sampler.done:
            timestep = float(sampler.timesteps[sampler.step_index])
            items = [DiTInput(latents, timestep, text, references) for text in texts]
            outputs = self.dit(items, self.attn)  # both labels in one packed forward
            velocity = outputs[0]
            if len(outputs) == 2:
                velocity = outputs[1] + guidance_scale * (outputs[0] - outputs[1])
            latents = sampler.step(velocity, latents)
        image = self.vae_decoder.decode(latents[None]).float()
        # [1, 3, H, W] in [0, 1] (the pipeline's "pt" output) and the VAE-space latents ("latent").
        vae_latents = unpatchify(self.vae_decoder.bn.denormalize(latents[None]))
        return (image / 2 + 0.5).clamp(0, 1), vae_latents


def pipeline_outputs(pipe, prompt, num_steps, guidance_scale, seed, height=None, width=None, images=None):
    """(images [1, 3, H, W] in [0, 1], VAE-space latents) of two pipeline calls with one seed."""
    outputs = []
    for output_type in ("pt", "latent"):
        with torch.no_grad():
            outputs.append(
                pipe(
                    image=list(images) if images else None, prompt=prompt, height=height, width=width,
                    num_inference_steps=num_steps, guidance_scale=guidance_scale,
                    generator=torch.Generator().manual_seed(seed), output_type=output_type,
                    **pipeline_call_kwargs(),
                ).images
            )  # fmt: skip
    return tuple(outputs)


@pytest.fixture(scope="module")
def base_pipeline(tiny_folder):
    from diffusers import Flux2KleinPipeline

    folder, _ = tiny_folder
    return Flux2KleinPipeline.from_pretrained(str(folder), is_distilled=False).to("cpu")


def test_text_to_image_with_guidance_matches_pipeline(tiny_folder, base_pipeline):
    folder, _ = tiny_folder
    assert not base_pipeline.config.is_distilled
    image, latents = OurPipeline(folder, is_distilled=False)(
        "a lighthouse at dusk", num_steps=3, guidance_scale=4.0, seed=5, height=64, width=48
    )
    expected_image, expected_latents = pipeline_outputs(
        base_pipeline, "a lighthouse at dusk", 3, 4.0, 5, 64, 48
    )
    assert base_pipeline.do_classifier_free_guidance  # set by the call
    assert image.shape == expected_image.shape == (1, 3, 64, 48)
    assert psnr_db(image, expected_image) >= MIN_PSNR_DB
    assert latent_psnr_db(latents, expected_latents) >= MIN_PSNR_DB
    _, unguided = OurPipeline(folder, is_distilled=False)(
        "a lighthouse at dusk", 3, 1.0, seed=5, height=64, width=48
    )
    assert latent_psnr_db(unguided, expected_latents) < MIN_PSNR_DB  # guidance is what made them equal


def test_edit_with_two_references_matches_pipeline(tiny_folder):
    folder, pipe = tiny_folder
    images = reference_images()
    ours = OurPipeline(folder, is_distilled=True)
    image, latents = ours("put the cat on the sofa", 4, 4.0, seed=9, images=images)
    expected_image, expected_latents = pipeline_outputs(
        pipe, "put the cat on the sofa", 4, 4.0, 9, images=images
    )
    assert not pipe.do_classifier_free_guidance  # distilled: guidance_scale ignored
    assert image.shape == expected_image.shape == (1, 3, 80, 64)  # the first reference's size by default
    assert psnr_db(image, expected_image) >= MIN_PSNR_DB
    assert latent_psnr_db(latents, expected_latents) >= MIN_PSNR_DB
    _, one_reference = ours("put the cat on the sofa", 4, 4.0, seed=9, images=images[:1])
    assert latent_psnr_db(one_reference, expected_latents) < MIN_PSNR_DB  # the second reference matters
