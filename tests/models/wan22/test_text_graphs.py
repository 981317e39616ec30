"""Wan's prompt encoder under CUDA graphs: UMT5 attends both ways, so a prompt padded to the
pipeline's length must mask the padding out as keys. The masked layer loop gives transformers' states for the
real tokens, padded or not (CPU), and the graphs replay them (CUDA, gpu tier)."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.cuda_graphs import GraphedByLength
from mstar.engine.transfer import to_device
from mstar.models.text_fallback import fallback_tokenizer
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.text_encoder import UMT5PromptEncoder, build_umt5

PROMPTS = ["a fox", "a lighthouse on a rocky coast during a storm, waves crashing " * 3, ""]


def _encoder(device: str = "cpu", dtype=torch.float32, cuda_graphs: bool = False) -> UMT5PromptEncoder:
    config = tiny_wan22_config()
    tokenizer = fallback_tokenizer(vocab_size=config.text_encoder["vocab_size"])
    model = build_umt5(config.text_encoder, device, dtype, seed=3)
    return UMT5PromptEncoder(model, tokenizer, device, config.max_text_tokens, cuda_graphs=cuda_graphs)


def _embeds(encoder: UMT5PromptEncoder, prompt: str) -> torch.Tensor:
    ids = encoder.tokenizer(
        [prompt], max_length=encoder.max_text_tokens, truncation=True, return_tensors="pt"
    )
    return to_device(encoder.model.shared(ids["input_ids"]), encoder.device)  # [1, L, d_model]


@torch.inference_mode()
def test_masked_layers_give_transformers_states_padded_or_not():
    encoder = _encoder()
    embeds = _embeds(encoder, "a lighthouse on a rocky coast")
    length = embeds.shape[1]
    reference = encoder.model(inputs_embeds=embeds).last_hidden_state
    unpadded = encoder._last_hidden(embeds, torch.ones((1, length), dtype=torch.bool))
    torch.testing.assert_close(unpadded, reference, rtol=0, atol=0)  # a zero mask adds nothing

    padded = torch.cat([embeds, torch.zeros(1, 7, embeds.shape[2])], dim=1)
    valid = torch.arange(length + 7)[None] < length
    torch.testing.assert_close(
        encoder._last_hidden(padded, valid)[:, :length], reference, rtol=1e-5, atol=1e-6
    )
    all_valid = torch.ones((1, length + 7), dtype=torch.bool)
    unmasked = encoder._last_hidden(padded, all_valid)[:, :length]  # padding seen as keys: other states
    assert not torch.allclose(unmasked, reference, rtol=1e-3, atol=1e-4)


@torch.inference_mode()
def test_every_prompt_runs_padded_to_the_pipelines_length_with_the_padding_masked():
    encoder = _encoder()
    calls = []
    encoder.hidden.fn = lambda embeds, valid: (
        calls.append(valid.clone()) or encoder._last_hidden(embeds, valid)
    )
    (embedding,) = encoder.encode(["a fox"])
    (valid,) = calls
    num_tokens = embedding.shape[0]
    assert valid.shape == (1, encoder.max_text_tokens) and num_tokens < encoder.max_text_tokens
    assert valid[0, :num_tokens].all() and not valid[0, num_tokens:].any()


def test_off_cuda_the_graphs_are_not_captured():
    encoder = _encoder(cuda_graphs=True)
    assert not encoder.use_graphs
    encoder.warmup()  # nothing to capture
    assert not encoder.hidden.captured
    graphed = GraphedByLength(
        lambda x, valid: x * valid[..., None], pad_id=0, device="cpu", row_shape=(2,), dtype=torch.float32,
        key_mask=True, bucket_lengths=(4,),
    )  # fmt: skip
    assert graphed(torch.ones(1, 3, 2)).tolist() == [[[1.0, 1.0]] * 3]  # eager: padded to 4, 3 valid
    assert graphed(torch.ones(1, 5, 2)).shape == (1, 5, 2)  # past the largest bucket: unpadded


@pytest.mark.gpu
def test_cuda_graph_replays_match_the_eager_encoder():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    encoder = _encoder("cuda", torch.bfloat16, cuda_graphs=True)
    assert isinstance(encoder.hidden, GraphedByLength)
    encoder.warmup()
    assert encoder.hidden.captured
    with torch.inference_mode():
        embeds = [_embeds(encoder, p) for p in PROMPTS]
        eager = [encoder.hidden.run_padded(e, encoder.hidden.bucket_for(e.shape[1]))[0] for e in embeds]
        replayed = encoder.encode(PROMPTS)  # each replay's output is copied out of the graph's buffer
        again = encoder.encode(PROMPTS[:1])[0]
    for want, got in zip(eager, replayed, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert again.equal(replayed[0])  # same prompt, same bucket: same bytes
