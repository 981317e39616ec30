"""Our Qwen3 prompt encoder against Flux2KleinPipeline.encode_prompt, with a real (tiny, offline)
byte-level BPE tokenizer loaded from the saved folder as the pipeline loads it."""

import pytest
import torch

from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.text_encoder import (
    PromptEncoder,
    build_qwen3,
    padded_attention_mask,
)

PROMPTS = ["a red fox in the snow", "", "x" * 200]  # the last is truncated to max_sequence_length


def load_encoder(folder, out_layers=TINY.text_encoder_out_layers, config=TINY.text_encoder):
    from transformers import AutoTokenizer

    model = build_qwen3(
        config, "cpu", torch.float32, path=str(folder / "text_encoder"), out_layers=out_layers
    )
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
    return PromptEncoder(
        model, tokenizer, "cpu", out_layers, TINY.max_sequence_length, config["num_hidden_layers"]
    )


def pipeline_embeds(pipe, prompt, out_layers=TINY.text_encoder_out_layers):
    with torch.no_grad():
        embeds, text_ids = pipe.encode_prompt(
            prompt,
            device="cpu",
            max_sequence_length=TINY.max_sequence_length,
            text_encoder_out_layers=out_layers,
        )
    return embeds[0], text_ids[0]


def test_embeddings_match_the_pipeline(tiny_folder):
    folder, pipe = tiny_folder
    encoder = load_encoder(folder)
    ours = encoder.encode(PROMPTS)
    for prompt, got in zip(PROMPTS, ours, strict=True):
        expected, text_ids = pipeline_embeds(pipe, prompt)
        assert got.shape == (TINY.max_sequence_length, TINY.transformer.joint_attention_dim)
        assert text_ids.shape == (TINY.max_sequence_length, 4)  # every padded position reaches the DiT
        assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5), prompt


def test_padding_states_are_used_and_prompts_fill_differently(tiny_folder):
    folder, _ = tiny_folder
    encoder = load_encoder(folder)
    input_ids, mask = encoder.tokenize("short")
    assert input_ids.shape == (1, TINY.max_sequence_length) and 0 < int(mask.sum()) < TINY.max_sequence_length
    long_ids, long_mask = encoder.tokenize(PROMPTS[2])
    assert int(long_mask.sum()) == TINY.max_sequence_length  # truncated, no padding left
    short, other = encoder.encode(["short", "other words"])
    assert not torch.equal(short[-1], other[-1])  # a padding state sees the prompt


def test_only_the_layers_read_are_built_and_the_deepest_is_not_normed(tiny_folder):
    """Out layers (1, 2) of the 3-layer encoder: two layers built, states un-normed, as the
    pipeline's hidden_states[1], [2]."""
    folder, pipe = tiny_folder
    encoder = load_encoder(folder, out_layers=(1, 2))
    assert len(encoder.model.layers) == 2
    (got,) = encoder.encode([PROMPTS[0]])
    expected, _ = pipeline_embeds(pipe, PROMPTS[0], out_layers=(1, 2))
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_mask_is_causal_over_real_keys():
    mask = padded_attention_mask(torch.tensor([True, True, False, False]))[0, 0]
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, False, False],
        [True, True, False, False],
    ]


@pytest.mark.parametrize(
    "is_distilled, scale, negative",
    [(True, 4.0, False), (False, 4.0, True), (False, 1.0, False), (False, None, True)],
)
def test_node_encodes_the_negative_prompt_only_under_guidance(is_distilled, scale, negative):
    import dataclasses

    from mstar.graph import GenerationParams, RequestState
    from mstar.models.flux2_klein.model import Flux2KleinSpec
    from mstar.models.flux2_klein.pipeline import Flux2KleinPipeline
    from mstar.models.text_encoding import PromptEmbedsNode

    class CountingEncoder:
        def __init__(self):
            self.seen: list[str] = []

        def encode(self, prompts):
            self.seen += prompts
            return [torch.zeros(2, 3) for _ in prompts]

    config = dataclasses.replace(TINY, is_distilled=is_distilled)
    encoder = CountingEncoder()
    node = PromptEmbedsNode(Flux2KleinPipeline(config, "cpu", text_encoder=encoder))
    params = Flux2KleinSpec(config).validate(GenerationParams(prompt="a cat", guidance_scale=scale, seed=1))
    request = RequestState("r1", params)
    node.forward([request])
    assert ("negative_prompt_embeds" in request.tensors) is negative
    assert encoder.seen == (["a cat", ""] if negative else ["a cat"])
