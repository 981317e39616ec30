"""The LLM engine's tokens on CPU (tiny Qwen3, float64, seeded random weights): equal to transformers'
greedy generate; the same alone and in a changing batch; chunked prefill, prefix-cache reuse and
preemption change nothing; an abort gives every page back."""

import random

import pytest
import torch

from tests.llm.engine import TINY, make_node, request, run, tiny_model

NUM_NEW_TOKENS = 64


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a CPU worker runs (small GEMMs; a busy host's OpenMP team is slow)
    yield tiny_model()
    torch.set_num_threads(threads)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(TINY.vocab_size) for _ in range(rng.randint(3, 40))] for _ in range(count)]


def transformers_greedy(model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY.to_hf())).double().eval()
    hf.load_state_dict({**model.state_dict(), "lm_head.weight": model.lm_head.weight}, strict=True)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


def test_greedy_tokens_equal_transformers_generate(model):
    batch = prompts(8)
    ours, _, _ = run(make_node(model), [request(p, NUM_NEW_TOKENS) for p in batch])
    for prompt, tokens in zip(batch, ours, strict=True):
        assert tokens == transformers_greedy(model, prompt, NUM_NEW_TOKENS)


def test_each_request_is_the_same_alone_and_with_others_joining_and_leaving(model):
    """Request 0 (and each of the 15 others) against its own run alone, greedy and seeded sampling."""
    batch = prompts(16, seed=1)
    rng = random.Random(2)
    requests = [
        request(p, rng.randint(4, 24), temperature=0.0 if i % 2 else 0.9, top_p=0.95, seed=i)
        for i, p in enumerate(batch)
    ]
    joins = [0] + [rng.randint(0, 20) for _ in batch[1:]]
    together, _, _ = run(make_node(model, max_num_batched_tokens=48), requests, joins)
    for index, params in enumerate(requests):
        alone, _, _ = run(make_node(model), [params])
        assert together[index] == alone[0], f"request {index}"


def test_chunked_prefill_equals_one_shot_prefill(model):
    batch = prompts(4, seed=3)
    batch[0] = batch[0] * 4  # a long prompt: chunked in steps of 16 tokens
    requests = [request(p, 12) for p in batch]
    chunked, _, _ = run(make_node(model, max_num_seqs=4, max_num_batched_tokens=16), requests)
    whole, _, _ = run(make_node(model, max_num_batched_tokens=4096), requests)
    assert chunked == whole


def test_prefix_cache_reuse_gives_the_same_tokens(model):
    system = prompts(1, seed=4)[0] * 3  # a shared "system prompt" of several pages
    batch = [system + tail for tail in prompts(3, seed=5)]
    node = make_node(model)
    first, _, _ = run(node, [request(batch[0], 10)])
    cached, _, _ = run(node, [request(p, 10) for p in batch])  # join later: the system pages are cached
    assert node.scheduler.stats.prefix_cache_hits >= 2 * (len(system) // 4) * 4
    fresh, _, _ = run(make_node(model, enable_prefix_caching=False), [request(p, 10) for p in batch])
    assert cached == fresh and first[0] == fresh[0]


def test_preemption_and_recompute_give_the_same_tokens(model):
    batch = prompts(6, seed=6)
    requests = [request(p, 30, temperature=0.8, seed=i) for i, p in enumerate(batch)]
    tight = make_node(
        model, context_length=80, kv_pool_pages=30, enable_prefix_caching=False
    )  # 6 x ~70 tokens do not fit
    squeezed, _, _ = run(tight, requests)
    assert tight.scheduler.stats.num_preemptions > 0
    roomy, _, _ = run(make_node(model), requests)
    assert squeezed == roomy


def test_abort_frees_every_page(model):
    node = make_node(model, context_length=128, kv_pool_pages=64, enable_prefix_caching=False)
    batch = prompts(5, seed=7)
    _, _, _ = run(node, [request(p, 40) for p in batch], abort_at={0: 2, 1: 5, 3: 1})
    stats = node.scheduler.pages.stats()
    assert stats.num_used == 0 and stats.num_free == 64
    assert node.scheduler.num_sequences == 0


def test_streamed_pieces_add_up_to_the_outputs(model):
    outputs, pieces, _ = run(make_node(model), [request(p, 9) for p in prompts(2, seed=8)])
    for tokens, sent in zip(outputs, pieces, strict=True):
        assert [t for piece in sent for t in piece["token_ids"]] == tokens
        assert sent[-1]["finish_reason"] == "length" and sent[-1]["num_output_tokens"] == 9


def test_overlapped_steps_give_the_same_tokens_and_pieces(model):
    """Queueing step n + 1 from step n's samples on the device before reading n back (the GPU mode)
    changes nothing: joins, sampling, stop token ids, stop strings, preemption, an abort."""
    batch = prompts(8, seed=9)
    rng = random.Random(10)
    requests = [
        request(
            p,
            rng.randint(3, 20),
            temperature=0.0 if i % 3 else 0.7,
            seed=i,
            stop_token_ids=list(range(3, 512, 16)),
        )
        for i, p in enumerate(batch)
    ]
    requests[2] = request(batch[2], 20, stop=["\x05"], temperature=1.0, seed=2)
    joins = [0, 0, 1, 3, 3, 7, 8, 12]
    fields = dict(context_length=80, kv_pool_pages=22, enable_prefix_caching=True)
    sync_node, overlap_node = make_node(model, **fields), make_node(model, overlap=True, **fields)
    sync = run(sync_node, requests, joins, abort_at={4: 6})
    overlapped = run(overlap_node, requests, joins, abort_at={4: 6})
    assert overlapped[0] == sync[0]
    for index, (sync_pieces, overlap_pieces) in enumerate(zip(sync[1], overlapped[1], strict=True)):
        if index == 4:
            continue  # aborted: overlapped pieces come a step later, so fewer of them left before the abort
        assert "".join(p["text"] for p in sync_pieces) == "".join(p["text"] for p in overlap_pieces)
        assert [p.get("finish_reason") for p in sync_pieces][-1:] == [
            p.get("finish_reason") for p in overlap_pieces
        ][-1:]
    assert overlap_node.scheduler.stats.num_preemptions > 0 and sync_node.scheduler.stats.num_preemptions > 0
    assert any(pieces[-1]["finish_reason"] == "stop" for pieces in overlapped[1] if pieces)
    for node in (sync_node, overlap_node):
        assert node.scheduler.pages.stats().num_used == 0 and node.scheduler.num_sequences == 0
