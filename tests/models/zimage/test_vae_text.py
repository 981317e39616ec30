"""VAE decoder and Qwen3 prompt encoder against diffusers' AutoencoderKL and ZImagePipeline."""

import numpy as np
import torch

from mstar.graph import RequestState
from mstar.models.zimage.config import TINY
from mstar.models.zimage.text_encoder import Qwen3PromptEncoder
from mstar.models.zimage.weights import build_vae_decoder
from tests.models.text_params import text_params, zimage_text_node


def test_vae_decode_matches_diffusers(tiny_folder):
    folder, pipe = tiny_folder
    ours = build_vae_decoder(TINY.vae, "cpu", torch.float32, model_path=str(folder))
    latents = torch.randn(1, 16, 6, 10, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        vae = pipe.vae
        expected = vae.decode(latents / vae.config.scaling_factor + vae.config.shift_factor).sample
        got = ours.decode(latents)
        frames = ours.decode_frames(latents[0])
    assert got.shape == expected.shape == (1, 3, 12, 20)
    assert (got - expected).abs().max().item() <= 1e-5
    as_pil_array = np.asarray(pipe.image_processor.postprocess(expected, output_type="pil")[0])
    assert frames.dtype == torch.uint8 and frames.shape == (1, 12, 20, 3)
    assert np.array_equal(frames[0].numpy(), as_pil_array)


def test_prompt_embeddings_match_encode_prompt(tiny_folder):
    _, pipe = tiny_folder
    prompts = ["a red fox in the snow", "üñï 日本語, a much longer prompt that pads the other one"]
    expected, _ = pipe.encode_prompt(list(prompts), device="cpu", do_classifier_free_guidance=False)
    got = Qwen3PromptEncoder(pipe.text_encoder, pipe.tokenizer, "cpu").encode(list(prompts))
    for ours, reference in zip(got, expected, strict=True):
        assert ours.shape == reference.shape
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_text_node_encodes_negative_prompt_only_under_guidance(tiny_folder):
    _, pipe = tiny_folder
    node = zimage_text_node(Qwen3PromptEncoder(pipe.text_encoder, pipe.tokenizer, "cpu"))
    plain = RequestState("a", text_params("a cat", 0.0))
    guided = RequestState("b", text_params("a cat", 2.0, "blurry"))
    node.forward([plain, guided])
    assert set(plain.tensors) == {"prompt_embeds"}
    assert set(guided.tensors) == {"prompt_embeds", "negative_prompt_embeds"}
    torch.testing.assert_close(plain.tensors["prompt_embeds"], guided.tensors["prompt_embeds"])
    negative, _ = pipe.encode_prompt(["blurry"], device="cpu", do_classifier_free_guidance=False)
    torch.testing.assert_close(guided.tensors["negative_prompt_embeds"], negative[0], rtol=1e-5, atol=1e-6)
