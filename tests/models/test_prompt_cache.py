"""The shared text_encoder node encodes each text it has not seen (once per batch, however many
requests carry it) and serves the rest from a byte-bounded LRU cache; a cached embedding is the one
a fresh forward gives (the real tiny Wan encoder)."""

from __future__ import annotations

import torch

from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS, PromptEmbedsCache
from tests.models.test_prompt_encoders import wan_encoder
from tests.models.text_params import text_params, wan_text_node


class CountingEncoder:
    """Fake encoder: one [len(text) + 1, 4] tensor per prompt; records what it was asked."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        self.calls.append(list(prompts))
        return [torch.full((len(p) + 1, 4), float(len(p))) for p in prompts]


def guided(request_id: str, prompt: str, negative: str | None = None) -> RequestState:
    return RequestState(request_id, text_params(prompt, 5.0, negative))


def test_each_new_text_is_encoded_once_and_repeats_come_from_the_cache():
    encoder = CountingEncoder()
    node = wan_text_node(encoder)
    first = [guided("a", "a fox"), guided("b", "a lighthouse"), guided("c", "a fox", "blurry")]
    node.forward(first)
    assert encoder.calls == [["a fox", "", "a lighthouse", "blurry"]]
    assert first[0].tensors[PROMPT_EMBEDS] is first[2].tensors[PROMPT_EMBEDS]
    assert first[0].tensors[NEGATIVE_PROMPT_EMBEDS].shape == (1, 4)  # the default negative prompt ""
    later = [guided("d", "a fox"), guided("e", "a koi pond")]
    node.forward(later)
    assert encoder.calls[1] == ["a koi pond"]  # "a fox" and "" were cached
    assert later[0].tensors[PROMPT_EMBEDS] is first[0].tensors[PROMPT_EMBEDS]
    assert node.event_counts() == {"prompt_cache_hits": 2, "prompt_cache_misses": 5}


def test_unguided_requests_encode_no_negative_prompt():
    encoder = CountingEncoder()
    request = RequestState("a", text_params("a fox", 1.0))
    wan_text_node(encoder).forward([request])
    assert encoder.calls == [["a fox"]] and set(request.tensors) == {PROMPT_EMBEDS}


def test_a_zero_budget_turns_the_cache_off():
    encoder = CountingEncoder()
    node = wan_text_node(encoder, max_cached_bytes=0)
    node.forward([guided("a", "a fox")])
    node.forward([guided("b", "a fox")])
    assert encoder.calls == [["a fox", ""], ["a fox", ""]] and len(node.cache) == 0


def test_the_least_recently_used_text_goes_first_when_over_budget():
    cache = PromptEmbedsCache(max_bytes=3 * 64)  # three [4, 4] float32 tensors
    for text in ["a", "b", "c"]:
        cache.put(text, torch.zeros(4, 4))
    assert cache.get("a") is not None  # "b" is now the least recently used
    cache.put("d", torch.zeros(4, 4))
    assert cache.get("b") is None and all(cache.get(t) is not None for t in "acd")
    assert cache.num_bytes == 3 * 64
    cache.put("too big", torch.zeros(16, 4))
    assert cache.get("too big") is None and len(cache) == 3


def test_a_cached_embedding_equals_a_fresh_forward_of_the_real_encoder():
    encoder = wan_encoder()
    node = wan_text_node(encoder)
    cached_run, fresh_run = guided("a", "a lighthouse at night"), guided("b", "a lighthouse at night")
    node.forward([cached_run])
    node.forward([fresh_run])
    assert fresh_run.tensors[PROMPT_EMBEDS] is cached_run.tensors[PROMPT_EMBEDS]
    torch.testing.assert_close(
        encoder.encode(["a lighthouse at night"])[0], cached_run.tensors[PROMPT_EMBEDS], rtol=0, atol=0
    )
