"""offload_text_encoder: Wan's UMT5 blocks stream from host memory and its token embedding stays on
the host; the embeddings must be exactly those of the resident encoder."""

from __future__ import annotations

import pytest
import torch

from mstar.config import ServerConfig
from mstar.models.text_fallback import fallback_tokenizer
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.text_encoder import UMT5PromptEncoder, build_umt5
from mstar.runtime.runtime import Runtime
from tests.serving.tiny_specs import TINY_ZIMAGE_PATH, TinyZImageSpec

PROMPTS = ["a fox", "a lighthouse on a rocky coast during a storm, waves crashing", ""]


def encoders(device: str, dtype: torch.dtype) -> tuple[UMT5PromptEncoder, UMT5PromptEncoder]:
    """(resident, offloaded) encoders over the same seeded weights."""
    config = tiny_wan22_config()
    tokenizer = fallback_tokenizer(vocab_size=config.text_encoder["vocab_size"])
    pair = []
    for offload in (False, True):
        model = build_umt5(config.text_encoder, device, dtype, seed=3)
        pair.append(UMT5PromptEncoder(model, tokenizer, device, config.max_text_tokens, offload=offload))
    return pair[0], pair[1]


def test_offloaded_encoder_gives_the_resident_encoders_embeddings_on_cpu():
    resident, offloaded = encoders("cpu", torch.float32)
    assert offloaded.streamed is not None and resident.streamed is None
    for _ in range(2):  # the second forward reuses the slots
        for expected, got in zip(resident.encode(PROMPTS), offloaded.encode(PROMPTS), strict=True):
            assert torch.equal(expected, got)
    assert offloaded.model.encoder.embed_tokens is offloaded.model.shared


def test_a_model_that_cannot_stream_refuses_the_option_at_boot():
    config = ServerConfig(model=TINY_ZIMAGE_PATH, random_weights=True, offload_text_encoder=True)
    with pytest.raises(ValueError, match="offload_text_encoder"):
        Runtime(config, TinyZImageSpec())


@pytest.mark.gpu
def test_offloaded_encoder_on_cuda_is_exact_and_keeps_the_weights_on_the_host():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    resident, offloaded = encoders("cuda", torch.bfloat16)
    for expected, got in zip(resident.encode(PROMPTS), offloaded.encode(PROMPTS), strict=True):
        assert got.device.type == "cuda" and torch.equal(expected, got)
    assert offloaded.model.shared.weight.device.type == "cpu"
    assert resident.model.shared.weight.device.type == "cpu"  # the token table stays on the host
    block_weights = [p for p in offloaded.model.encoder.block.parameters()]
    assert all(p.device.type == "cpu" and p.is_pinned() for p in block_weights)
