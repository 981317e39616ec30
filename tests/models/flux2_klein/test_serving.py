"""Seeded klein requests through our nodes (text_encoder, vae_encoder, dit, vae_decoder; no server)
against Flux2KleinPipeline from the same tiny save_pretrained folder: text-to-image with
classifier-free guidance on the base checkpoint, an edit with two references on the distilled one;
then one request alone and packed with others of other sizes and reference counts: the same bytes."""

import numpy as np
import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState, reference_image_input
from tests.models.flux2_klein.test_generation import psnr_db, reference_images
from tests.models.flux2_klein.tiny_parts import (
    TinyFlux2KleinBaseSpec,
    TinyFlux2KleinSpec,
    pipeline_call_kwargs,
    save_tiny_pipeline,
)

MIN_PSNR_DB = 40.0


def build_nodes(spec, folder):
    config = ServerConfig(model=spec.name, compile_mode="off", warmup=False)
    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, model_path=str(folder))
    return spec.build_nodes(ctx)


def make_request(spec, request_id, images=(), **fields):
    sizes = tuple((image.width, image.height) for image in images)
    params = spec.validate(GenerationParams(reference_sizes=sizes, **fields))
    request = RequestState(request_id, params)
    for index, image in enumerate(images):
        request.tensors[reference_image_input(index)] = np.asarray(image.convert("RGB"))
    return request


def generate(nodes, requests):
    """The walks as the runtime runs them: every request's steps packed into one DiT forward.
    Returns each request's final latents (the decode consumes them)."""
    nodes["text_encoder"].forward(requests)
    edits = [r for r in requests if r.params.reference_sizes]
    if edits:
        nodes["vae_encoder"].forward(edits)
    dit = nodes["dit"]
    running = list(requests)
    while running:
        dit.forward(running)
        running = [r for r in running if not dit.check_stop(r)]
    latents = [r.tensors["latents"].clone() for r in requests]
    nodes["vae_decoder"].forward(requests)
    return latents


def pipeline_image(pipe, params, images=None) -> np.ndarray:
    """The pipeline's image [H, W, 3] in [0, 1] for our validated params."""
    with torch.no_grad():
        out = pipe(
            image=list(images) if images else None, prompt=params.prompt, height=params.height,
            width=params.width, num_inference_steps=params.num_inference_steps,
            guidance_scale=params.guidance_scale, generator=torch.Generator().manual_seed(params.seed),
            output_type="np", **pipeline_call_kwargs(),
        ).images  # fmt: skip
    return out[0]


def frames_01(request) -> np.ndarray:
    frames = request.tensors["frames"]
    assert frames.dtype == torch.uint8 and frames.shape[0] == 1
    return frames[0].numpy().astype(np.float64) / 255.0


@pytest.fixture(scope="module")
def distilled_nodes(tiny_folder):
    folder, _ = tiny_folder
    return build_nodes(TinyFlux2KleinSpec(), folder)


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    from diffusers import Flux2KleinPipeline

    folder = tmp_path_factory.mktemp("flux2-klein-base-tiny")
    save_tiny_pipeline(folder, is_distilled=False)
    return folder, Flux2KleinPipeline.from_pretrained(str(folder)).to("cpu")


def test_text_to_image_with_guidance_matches_pipeline(base_folder):
    folder, pipe = base_folder
    spec = TinyFlux2KleinBaseSpec()
    nodes = build_nodes(spec, folder)
    ours = make_request(
        spec, "t2i", prompt="a lighthouse", width=48, height=64, num_inference_steps=3, seed=5
    )
    assert ours.params.guidance_scale == 4.0 and spec.geometry.labels(4.0) == ("cond", "uncond")
    generate(nodes, [ours])
    expected = pipeline_image(pipe, ours.params)
    assert pipe.do_classifier_free_guidance
    assert expected.shape == (64, 48, 3)
    assert psnr_db(torch.from_numpy(frames_01(ours)), torch.from_numpy(expected)) >= MIN_PSNR_DB


def test_edit_with_two_references_matches_pipeline(distilled_nodes, tiny_folder):
    _, pipe = tiny_folder
    spec = TinyFlux2KleinSpec()
    images = reference_images()
    ours = make_request(spec, "edit", images, prompt="put the cat on the sofa", num_inference_steps=4, seed=9)
    assert (ours.params.width, ours.params.height) == (64, 80)  # the first reference's size
    generate(distilled_nodes, [ours])
    assert set(ours.tensors) == {"prompt_embeds", "frames"}  # the references' tensors are gone
    expected = pipeline_image(pipe, ours.params, images)
    assert not pipe.do_classifier_free_guidance  # distilled: guidance_scale ignored
    assert psnr_db(torch.from_numpy(frames_01(ours)), torch.from_numpy(expected)) >= MIN_PSNR_DB


def test_alone_and_packed_with_other_sizes_and_references_give_the_same_bytes(distilled_nodes):
    spec = TinyFlux2KleinSpec()
    images = reference_images()

    def requests():
        return [
            make_request(spec, "a", prompt="a red cube", width=48, height=40, num_inference_steps=3, seed=1),
            make_request(spec, "b", images, prompt="two refs", num_inference_steps=3, seed=2),
            make_request(spec, "c", prompt="a longer prompt here", width=64, height=64, num_inference_steps=3, seed=3),
            make_request(spec, "d", images[1:], prompt="one ref", width=32, height=56, num_inference_steps=3, seed=4),
        ]  # fmt: skip

    packed = requests()
    packed_latents = generate(distilled_nodes, packed)
    for index in (0, 1, 3):
        alone = requests()[index]
        (latents,) = generate(distilled_nodes, [alone])
        assert torch.equal(latents, packed_latents[index]), alone.request_id
        assert torch.equal(alone.tensors["frames"], packed[index].tensors["frames"]), alone.request_id


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_initial_noise_is_drawn_as_the_pipeline_draws_it(dtype):
    """The pipeline draws its noise with randn_tensor in the prompt embeddings' dtype (bf16 on a
    GPU) from the CPU generator: a bf16 draw is not the float32 one rounded in every torch release
    (torch 2.11's differ outright), so ours is drawn in that dtype too, then held in float32."""
    from diffusers.utils.torch_utils import randn_tensor

    from mstar.diffusion.denoise import COND
    from mstar.models.flux2_klein.pipeline import TEXT_OF_LABEL, Flux2KleinPipeline

    spec = TinyFlux2KleinSpec()
    request = make_request(spec, "a", prompt="p", width=64, height=48, num_inference_steps=2, seed=5)
    config = spec.preset  # distilled: one label
    request.tensors[TEXT_OF_LABEL[COND]] = torch.zeros(config.max_sequence_length, 3, dtype=dtype)
    pipeline = Flux2KleinPipeline(config, "cpu")
    start = pipeline.prepare_latents(request)
    rows, cols = pipeline.geometry.latent_grid(64, 48)
    expected = randn_tensor(
        (1, config.transformer.in_channels, rows, cols),
        generator=torch.Generator().manual_seed(5),
        dtype=dtype,
    )
    assert start.latents.dtype == torch.float32
    torch.testing.assert_close(start.latents, expected[0].float(), rtol=0, atol=0)
