"""Both prompt encoders (Wan's UMT5, Z-Image's Qwen3) encode one prompt per forward: a prompt's
embedding does not depend on the prompts batched with it, and transformers gets no mask to inspect
on the device (that check reads the GPU back, which waits for the DiT step queued before it on a
busy server). Qwen3 is causal and runs unpadded without a mask; UMT5 attends both ways and runs
padded to its length bucket with an additive key mask of our own, as the pipeline pads and masks."""

from __future__ import annotations

import pytest
import torch

from mstar.models.text_fallback import FallbackTokenizer, fallback_tokenizer
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.text_encoder import UMT5PromptEncoder as WanPromptEncoder
from mstar.models.wan22.text_encoder import build_umt5
from mstar.models.zimage.config import TINY
from mstar.models.zimage.text_encoder import Qwen3PromptEncoder as ZImagePromptEncoder
from mstar.models.zimage.text_encoder import build_qwen3

PROMPTS = ["a fox", "a lighthouse on a rocky coast during a storm, waves crashing", ""]


def wan_encoder() -> WanPromptEncoder:
    """Gathers the prompt's token embeddings on the host and runs UMT5's blocks on them: its calls
    are those of the first block."""
    config = tiny_wan22_config()
    model = build_umt5(config.text_encoder, "cpu", torch.float32)
    tokenizer = fallback_tokenizer(vocab_size=config.text_encoder["vocab_size"])
    model.calls = []
    model.encoder.block[0].register_forward_pre_hook(
        lambda _, args, kwargs: model.calls.append(([tuple(a.shape) for a in args], dict(kwargs))),
        with_kwargs=True,
    )
    return WanPromptEncoder(model, tokenizer, "cpu", config.max_text_tokens)


def zimage_encoder() -> ZImagePromptEncoder:
    """Runs Qwen3's layers itself (hidden_states[-2] needs all but the last): its calls are those of
    the first layer."""
    model = build_qwen3(TINY.text_encoder, "cpu", torch.float32)
    tokenizer = FallbackTokenizer(TINY.text_encoder["vocab_size"], TINY.max_sequence_length, add_eos=False)
    encoder = ZImagePromptEncoder(model, tokenizer, "cpu", TINY.max_sequence_length)
    model.calls = []
    model.layers[0].register_forward_pre_hook(
        lambda _, args, kwargs: model.calls.append(([tuple(a.shape) for a in args], dict(kwargs))),
        with_kwargs=True,
    )
    return encoder


ENCODERS = {"wan22": wan_encoder, "zimage": zimage_encoder}


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_a_prompts_embedding_does_not_depend_on_its_batch(family):
    encoder = ENCODERS[family]()
    batched = encoder.encode(PROMPTS)
    for prompt, embedding in zip(PROMPTS, batched, strict=True):
        (alone,) = encoder.encode([prompt])
        assert embedding.shape == alone.shape and embedding.shape[0] > 0
        assert torch.equal(embedding, alone)
    assert batched[0].shape[0] < batched[1].shape[0]  # each keeps its own length


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_each_prompt_is_one_forward_with_no_mask_for_transformers(family):
    encoder = ENCODERS[family]()
    encoder.encode(PROMPTS)
    calls = encoder.model.calls
    assert len(calls) == len(PROMPTS)
    for shapes, kwargs in calls:
        assert shapes[0][0] == 1 if shapes else kwargs["hidden_states"].shape[0] == 1  # one prompt
        if family == "zimage":  # causal: no mask at all
            assert kwargs.get("attention_mask") is None and len(shapes) <= 1
        else:  # both ways: our additive key mask [1, 1, 1, bucket], already 4-D
            (_, bucket, _), mask_shape = shapes
            assert mask_shape == (1, 1, 1, bucket)
