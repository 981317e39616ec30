"""Drive the LLM node in this process, as the worker's step loop would: requests join at given
steps, every forward is one engine step, a request leaves when check_stop says so."""

from __future__ import annotations

import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, RequestState
from mstar.llm.build import build_llm_node
from mstar.llm.params import TextRequest, TextSampling
from mstar.llm.tokenizer import ByteTokenizer
from mstar.models.qwen3.config import Qwen3Config
from mstar.models.qwen3.nodes import geometry_of, load_qwen3

TINY = Qwen3Config(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, max_position_embeddings=512,
    bos_token_id=None, eos_token_id=None,
)  # fmt: skip


def tiny_model(config: Qwen3Config = TINY, dtype=torch.float64, seed: int = 0):
    return load_qwen3(config, "cpu", dtype, folder=None, seed=seed)


def make_node(
    model,
    config: Qwen3Config = TINY,
    dtype=torch.float64,
    context_length=512,
    overlap=False,
    compiled=None,
    **server_fields,
):
    server_fields.setdefault("kv_pool_pages", 256)
    server_fields.setdefault("kv_page_tokens", 4)
    server = ServerConfig(model="tiny", **server_fields)
    ctx = BuildContext(server, "cpu", ("llm",))
    tokenizer = ByteTokenizer(config.vocab_size)
    return build_llm_node(
        ctx,
        model,
        geometry_of(config),
        tokenizer,
        (),
        context_length,
        dtype,
        overlap=overlap,
        compiled=compiled,
    )


def request(prompt_ids, max_tokens=16, **sampling) -> TextRequest:
    sampling.setdefault("temperature", 0.0)
    return TextRequest(
        list(prompt_ids), TextSampling(max_tokens=max_tokens, ignore_eos=True, **sampling), stream=True
    )


def run(
    node, requests: list[TextRequest], joins: list[int] | None = None, abort_at: dict[int, int] | None = None
):
    """Output ids per request; request i joins before step joins[i]; abort_at {i: step} releases
    request i before that step. Returns (outputs, pieces, steps); the pieces without the first
    one's timeline (times of this run)."""
    joins = joins or [0] * len(requests)
    abort_at = abort_at or {}
    states = [RequestState(f"r{i}", params) for i, params in enumerate(requests)]
    pieces: list[list[dict]] = [[] for _ in requests]
    for index, state in enumerate(states):
        state.emit_output = lambda key, value, index=index: pieces[index].append(_without_timeline(value))
    active: list[RequestState] = []
    pending = sorted(range(len(states)), key=lambda i: joins[i])
    step = 0
    while pending or active:
        while pending and joins[pending[0]] <= step:
            index = pending.pop(0)
            node.prepare(states[index])
            active.append(states[index])
        for index, at in abort_at.items():
            if at == step and states[index] in active:
                node.release(states[index])
                active.remove(states[index])
        if active:
            node.forward(list(active))
            for state in [s for s in active if node.check_stop(s)]:
                node.release(state)
                active.remove(state)
        step += 1
    outputs = [list(state.tensors.get("token_ids", [])) for state in states]
    return outputs, pieces, step


def _without_timeline(piece: dict) -> dict:
    return {key: value for key, value in piece.items() if key != "timeline"}
