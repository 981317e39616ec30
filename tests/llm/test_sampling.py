"""Sampling on the device: each parameter does what it says, and a seed means the same tokens alone
or batched."""

import math

import pytest
import torch

from mstar.llm.noise import VocabNoise, mix32, mix32_tensor, row_key
from mstar.llm.sampling import RowSampling, Sampler

VOCAB = 50


@pytest.fixture
def sampler():
    return Sampler(VOCAB, torch.device("cpu"))


def logits_rows(count, seed=0):
    return torch.randn(count, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_host_and_device_hashes_agree():
    values = [0, 1, 12345, 2**32 - 1]
    assert mix32_tensor(torch.tensor(values)).tolist() == [mix32(v) for v in values]


def test_noise_is_uniform_and_depends_on_seed_and_index():
    noise = VocabNoise(4096, torch.device("cpu"))
    u = noise.uniform(torch.tensor([row_key(1, 0), row_key(1, 1), row_key(2, 0)]))
    assert u.min() > 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])


def test_greedy_is_the_argmax(sampler):
    logits = logits_rows(3)
    out = sampler.sample(logits, [RowSampling(temperature=0.0)] * 3)
    assert out.token_ids == logits.argmax(-1).tolist()


def test_same_seed_same_tokens_alone_or_batched(sampler):
    logits = logits_rows(6)
    rows = [RowSampling(temperature=1.0, seed=seed, index=3, top_p=0.9) for seed in range(6)]
    batched = sampler.sample(logits, rows).token_ids
    alone = [sampler.sample(logits[i : i + 1], [rows[i]]).token_ids[0] for i in range(6)]
    reordered = sampler.sample(logits.flip(0), rows[::-1]).token_ids[::-1]
    assert batched == alone == reordered


def test_sampling_follows_the_distribution(sampler):
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3)]))
    rows = [RowSampling(temperature=1.0, seed=s) for s in range(2000)]
    tokens = sampler.sample(logits.expand(2000, -1), rows).token_ids
    shares = [tokens.count(t) / 2000 for t in range(3)]
    assert shares == pytest.approx([0.7, 0.2, 0.1], abs=0.04)


def test_top_k_top_p_and_min_p_restrict_the_choices(sampler):
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1] + [0.0] * (VOCAB - 4)) + 1e-12
    logits = probs.log().expand(300, -1)
    seeds = range(300)
    top_k = set(sampler.sample(logits, [RowSampling(top_k=2, seed=s) for s in seeds]).token_ids)
    top_p = set(sampler.sample(logits, [RowSampling(top_p=0.65, seed=s) for s in seeds]).token_ids)
    min_p = set(sampler.sample(logits, [RowSampling(min_p=0.6, seed=s) for s in seeds]).token_ids)
    assert top_k == {0, 1} and top_p == {0, 1} and min_p == {0, 1}


def test_penalties(sampler):
    logits = torch.zeros(1, VOCAB)
    logits[0, 5], logits[0, 6] = 2.0, 1.9
    prompt_and_output = [([5], [])]
    assert sampler.sample(logits, [RowSampling(temperature=0.0)], prompt_and_output).token_ids == [5]
    repeated = sampler.sample(
        logits, [RowSampling(temperature=0.0, repetition_penalty=1.2)], prompt_and_output
    )
    assert repeated.token_ids == [6]  # 2.0 / 1.2 < 1.9
    # frequency and presence count outputs only
    outputs = [([], [5, 5])]
    assert sampler.sample(
        logits, [RowSampling(temperature=0.0, frequency_penalty=0.06)], outputs
    ).token_ids == [6]
    assert sampler.sample(
        logits, [RowSampling(temperature=0.0, presence_penalty=0.2)], outputs
    ).token_ids == [6]
    assert sampler.sample(
        logits, [RowSampling(temperature=0.0, presence_penalty=0.2)], [([5], [])]
    ).token_ids == [5]


def test_logprobs_are_of_the_raw_distribution(sampler):
    logits = logits_rows(2)
    out = sampler.sample(logits, [RowSampling(temperature=0.0, num_logprobs=3), RowSampling(temperature=0.5)])
    expected = torch.log_softmax(logits, -1)
    assert out.logprobs[0] == pytest.approx(expected[0].max().item(), abs=1e-6)
    assert out.top_ids[0] == expected[0].topk(3).indices.tolist()
    assert all(math.isfinite(v) for v in out.top_logprobs[0])


def test_compiled_race_draws_what_the_eager_one_does_for_any_row_count():
    """The compiled exponential race (GPU servers) picks the eager race's tokens, one compile for
    every row count past one, and counts a later compile as a recompile."""
    vocab = 1024
    eager = Sampler(vocab, torch.device("cpu"))
    compiled = Sampler(vocab, torch.device("cpu"), compile_mode="default")
    compiled.warmup()
    generator = torch.Generator().manual_seed(3)
    for num_rows in (1, 5, 17):
        logits = torch.randn(num_rows, vocab, generator=generator) * 3
        rows = [RowSampling(temperature=0.9, top_p=0.9, seed=11 + i, index=i) for i in range(num_rows)]
        with torch.inference_mode():  # as the runner samples
            drawn = compiled.launch(logits, rows).read().token_ids
        assert drawn == eager.launch(logits, rows).read().token_ids
    assert compiled.num_recompiles == 0
    assert compiled.compiled.num_compiles <= 2  # one row (specialised), then any count
