"""The shared text_encoder node: one encode call per batch, negative prompts only under each
model's guidance rule (Wan: scale > 1, Z-Image: scale > 0), results stored under the shared keys.
The prompt cache is off here (test_prompt_cache.py tests it)."""

import pytest

from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from tests.models.text_params import text_params, wan_text_node, zimage_text_node


class EchoEncoder:
    """Returns each prompt back in place of its embedding, and records the calls."""

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, prompts: list[str]) -> list[str]:
        self.calls.append(list(prompts))
        return [f"embeds({prompt})" for prompt in prompts]


def _request(request_id: str, guidance_scale: float, negative_prompt: str | None = None) -> RequestState:
    return RequestState(request_id, text_params(f"p{request_id}", guidance_scale, negative_prompt))


@pytest.mark.parametrize(("node_class", "guided_at"), [(wan_text_node, 1.5), (zimage_text_node, 0.5)])
def test_negative_prompts_follow_the_models_guidance_rule(node_class, guided_at):
    encoder = EchoEncoder()
    node = node_class(encoder, max_batch_size=4, max_cached_bytes=0)
    unguided = _request("1", guidance_scale=guided_at - 0.5, negative_prompt="blurry")
    guided = _request("2", guidance_scale=guided_at, negative_prompt="blurry")
    guided_default = _request("3", guidance_scale=guided_at)
    node.forward([unguided, guided, guided_default])

    assert encoder.calls == [["p1", "p2", "blurry", "p3", ""]]
    assert unguided.tensors == {PROMPT_EMBEDS: "embeds(p1)"}
    assert guided.tensors == {PROMPT_EMBEDS: "embeds(p2)", NEGATIVE_PROMPT_EMBEDS: "embeds(blurry)"}
    assert guided_default.tensors[NEGATIVE_PROMPT_EMBEDS] == "embeds()"
    assert (node.name, node.max_batch_size) == ("text_encoder", 4)


class WarmingEncoder(EchoEncoder):
    def __init__(self):
        super().__init__()
        self.num_warmups = 0

    def warmup(self) -> None:
        self.num_warmups += 1


@pytest.mark.parametrize("node_class", [wan_text_node, zimage_text_node])
def test_the_node_warms_up_its_encoder(node_class):
    encoder = WarmingEncoder()
    node_class(encoder).warmup()
    assert encoder.num_warmups == 1
