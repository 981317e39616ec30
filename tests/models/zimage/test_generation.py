"""A whole seeded generation through our nodes (no server) against diffusers' ZImagePipeline with
the same tiny components, read back from the diffusers folder by our loaders."""

import numpy as np
import pytest
import torch

from mstar.config import CompileSize, ServerConfig
from mstar.graph import BuildContext, RequestState
from mstar.models.zimage.config import TINY
from mstar.models.zimage.model import ZImageParams, ZImageSpec


def psnr_db(ours: np.ndarray, reference: np.ndarray) -> float:
    mse = np.mean((ours.astype(np.float64) - reference.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def nodes(tiny_folder):
    folder, _ = tiny_folder
    spec = ZImageSpec(TINY)
    config = ServerConfig(model="z-image-turbo", compile_mode="off", warmup=False)
    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, model_path=str(folder))
    return spec.build_nodes(ctx)


def generate(nodes, requests: list[RequestState]) -> list[torch.Tensor]:
    """encode_text, then the denoise loop with every request in each step, then the decode.
    Returns each request's final latents (the decode consumes them)."""
    nodes["text_encoder"].forward(requests)
    dit = nodes["dit"]
    for request in requests:
        dit.prepare(request)
    running = list(requests)
    while running:
        dit.forward(running)
        running = [r for r in running if not dit.check_stop(r)]
    latents = [r.tensors["latents"].clone() for r in requests]
    nodes["vae_decoder"].forward(requests)
    return latents


def request(request_id: str, **params) -> RequestState:
    base = {"prompt": "a red cube", "negative_prompt": "", "width": 48, "height": 40}
    return RequestState(request_id, ZImageParams(**{**base, **params}))


def pipeline_image(pipe, params: dict, output_type: str = "pil"):
    images = pipe(
        params.prompt,
        negative_prompt=params.negative_prompt or None,
        height=params.height,
        width=params.width,
        num_inference_steps=params.num_inference_steps,
        guidance_scale=params.guidance_scale,
        generator=torch.Generator("cpu").manual_seed(params.seed),
        output_type=output_type,
    ).images
    return images[0] if output_type == "latent" else np.asarray(images[0])


def test_seeded_generation_matches_pipeline(nodes, tiny_folder):
    _, pipe = tiny_folder
    ours = request("a", num_inference_steps=4, guidance_scale=0.0, seed=42)
    (latents,) = generate(nodes, [ours])
    expected_latents = pipeline_image(pipe, ours.params, output_type="latent")
    assert ((latents - expected_latents).norm() / expected_latents.norm()).item() <= 1e-5
    frames = ours.tensors["frames"]
    assert frames.dtype == torch.uint8 and frames.shape == (1, 40, 48, 3)
    assert set(ours.tensors) == {"prompt_embeds", "frames"}
    expected = pipeline_image(pipe, ours.params)
    assert psnr_db(frames[0].numpy(), expected) >= 40.0


def test_packed_requests_with_guidance_match_pipeline_each(nodes, tiny_folder):
    """Two requests of different sizes, one guided (cond + uncond labels), share every step."""
    _, pipe = tiny_folder
    guided = request(
        "g", prompt="a blue sphere", negative_prompt="dark", guidance_scale=1.5, num_inference_steps=3, seed=7
    )
    plain = request("p", width=32, height=56, guidance_scale=0.0, num_inference_steps=5, seed=9)
    generate(nodes, [guided, plain])
    for state in (guided, plain):
        expected = pipeline_image(pipe, state.params)
        assert state.tensors["frames"].shape == (1, *expected.shape)
        assert psnr_db(state.tensors["frames"][0].numpy(), expected) >= 40.0
    assert nodes["dit"].progress(plain) == (5, 5)


def test_different_seeds_give_different_images(nodes):
    first, second = (
        request("1", num_inference_steps=2, guidance_scale=0.0, seed=1),
        request("2", num_inference_steps=2, guidance_scale=0.0, seed=2),
    )
    generate(nodes, [first, second])
    assert not torch.equal(first.tensors["frames"], second.tensors["frames"])


def random_weight_nodes():
    spec = ZImageSpec(TINY)
    config = ServerConfig(model="z-image-turbo", compile_mode="off", warmup=False, random_weights=True)
    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, random_weights=True)
    return spec.build_nodes(ctx)


def test_random_weights_with_fallback_tokenizer_are_reproducible():
    images = []
    for _ in range(2):
        nodes = random_weight_nodes()
        state = request("r", num_inference_steps=2, guidance_scale=0.0, seed=3)
        generate(nodes, [state])
        images.append(state.tensors["frames"])
    assert images[0].shape == (1, 40, 48, 3)
    assert torch.equal(images[0], images[1])


def test_build_needs_weights_or_random_weights():
    spec = ZImageSpec(TINY)
    ctx = BuildContext(config=ServerConfig(), device="cpu", node_names=spec.node_names)
    with pytest.raises(ValueError, match="--model-path"):
        spec.build_nodes(ctx)


def test_warmup_runs_single_and_paired_steps(nodes):
    dit = nodes["dit"]
    dit.warmup_sizes = [CompileSize(width=48, height=32)]
    try:
        dit.warmup()
    finally:
        dit.warmup_sizes = []
    assert dit.num_recompiles() == 0
