"""Z-Image's prompt encoder runs Qwen3's layers itself: the same states as transformers'
hidden_states[-2], with or without right-padding (causal), which is what lets it replay one CUDA
graph per length bucket (GraphedByLength; captured and checked on CUDA in the gpu tier)."""

from __future__ import annotations

import pytest
import torch

from mstar.engine.cuda_graphs import GraphedByLength
from mstar.models.text_fallback import FallbackTokenizer
from mstar.models.zimage.config import TINY
from mstar.models.zimage.text_encoder import Qwen3PromptEncoder, build_qwen3


def _encoder(device: str = "cpu", dtype=torch.float32, cuda_graphs: bool = False) -> Qwen3PromptEncoder:
    model = build_qwen3(TINY.text_encoder, device, dtype)
    tokenizer = FallbackTokenizer(TINY.text_encoder["vocab_size"], TINY.max_sequence_length, add_eos=False)
    return Qwen3PromptEncoder(model, tokenizer, device, TINY.max_sequence_length, cuda_graphs=cuda_graphs)


@torch.inference_mode()
def test_the_layer_loop_gives_transformers_second_to_last_hidden_state():
    encoder = _encoder()
    ids = encoder.tokenize("a lighthouse on a rocky coast")
    reference = encoder.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-2]
    torch.testing.assert_close(encoder.hidden(ids), reference, rtol=0, atol=0)


@torch.inference_mode()
def test_right_padding_leaves_the_real_tokens_states_unchanged():
    encoder = _encoder()
    ids = encoder.tokenize("a fox in the snow")
    padded = torch.cat([ids, torch.full((1, 9), 3, dtype=ids.dtype)], dim=1)
    torch.testing.assert_close(
        encoder.hidden(padded)[:, : ids.shape[1]], encoder.hidden(ids), rtol=1e-5, atol=1e-6
    )


def test_off_cuda_the_graphs_are_not_used_and_buckets_round_up():
    assert not isinstance(_encoder(cuda_graphs=True).hidden, GraphedByLength)
    graphed = GraphedByLength(
        lambda ids: ids[..., None].float(), pad_id=0, device="cpu", bucket_lengths=(64, 16)
    )
    graphed.capture()  # a no-op off CUDA: calls run eagerly
    assert not graphed.captured
    assert [graphed.bucket_for(n) for n in (1, 16, 17, 64, 65)] == [16, 16, 64, 64, None]
    assert graphed(torch.tensor([[5, 6]])).shape == (1, 2, 1)


def test_a_failed_capture_leaves_the_eager_path_and_says_why(caplog):
    if torch.cuda.is_available():
        pytest.skip("made to fail by asking for CUDA graphs where there is no CUDA")
    graphed = GraphedByLength(
        lambda ids: ids[..., None].float(), pad_id=0, device="cuda", bucket_lengths=(16,)
    )
    with caplog.at_level("WARNING", logger="mstar.engine.cuda_graphs"):
        graphed.capture()
    assert not graphed.captured
    assert "CUDA graph capture failed, running eagerly" in caplog.text


@pytest.mark.gpu
def test_cuda_graph_replays_match_the_eager_layers():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    encoder = _encoder("cuda", torch.bfloat16, cuda_graphs=True)
    assert isinstance(encoder.hidden, GraphedByLength)
    encoder.warmup()
    assert encoder.hidden.captured
    prompts = ["a fox", "a lighthouse on a rocky coast during a storm, waves crashing " * 3, ""]
    with torch.inference_mode():
        eager = [encoder._second_to_last_hidden(encoder.tokenize(p).cuda())[0] for p in prompts]
        replayed = encoder.encode(prompts)  # each replay's output is copied out of the graph's buffer
    for want, got in zip(eager, replayed, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
    assert encoder.encode(prompts[:1])[0].equal(replayed[0])  # same prompt, same bucket: same bytes
