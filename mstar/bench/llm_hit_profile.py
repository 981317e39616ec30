"""Where a prefix-cache hit's host time goes: the API front and the LLM node's hit step, timed apart.

    python -m mstar.bench.llm_hit_profile --model qwen3-8b --shared-tokens 2048 --own-tokens 32

The bench's prefix-cache case (`mstar bench llm`): a request whose `--shared-tokens` system prompt is
cached, plus `--own-tokens` of its own, one output token. Two parts, each the median of `--runs`:
- front: what the API does with such a /v1/completions body before it hands the request over
  (the JSON body parsed, the schema validated, the prompt checked, the runtime request built and
  encoded), on this host's CPU, no server;
- node: the served LLM node driven in this process (as llm_step_profile builds it: the speed-up
  transform, decode graphs on a GPU): the ms to prepare the request, to queue its step (the host's
  launch: schedule with the prefix lookup, the layout, the tail as decode rows, the attention plan,
  the graph replay or the eager forward, the sampler) and to its token read back, with the host ms
  of each part, and the same for a miss (a fresh system prompt) for comparison.
`--device cpu` runs the node on the CPU (every part but the device's is what the GPU host does);
`--tiny-width` keeps the model's layer count and vocabulary but shrinks every width, so the CPU
runs the host's per-layer and per-token work of the real model without its arithmetic.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from mstar.bench.llm_step_profile import PartTimer, _synchronize, build

NUM_WARMUP_RUNS = 3


def front_ms(vocab_size: int, num_prompt: int, context_length: int, num_runs: int) -> dict[str, float]:
    """Median ms of each API step for a streaming /v1/completions body of `num_prompt` token ids."""
    import msgspec

    from mstar.api.json_body import parse_json_object
    from mstar.api.text_schemas import CompletionRequest
    from mstar.llm.frontend import TextFrontend
    from mstar.llm.tokenizer import ByteTokenizer

    class Spec:  # the frontend's view of a text model: its tokenizer and context length
        def load_tokenizer(self, config: Any) -> ByteTokenizer:
            return ByteTokenizer(vocab_size)

        def context_length(self, config: Any) -> int:
            return context_length

    rng = random.Random(0)
    body = {"prompt": [rng.randrange(vocab_size) for _ in range(num_prompt)], "max_tokens": 1}
    body |= {
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw = json.dumps(body).encode()
    frontend, encoder = TextFrontend(Spec(), None), msgspec.msgpack.Encoder()
    steps = {
        "parse_json": lambda state: state.update(fields=parse_json_object(raw)),
        "validate": lambda state: state.update(body=CompletionRequest.model_validate(state["fields"])),
        "prompts": lambda state: state.update(prompts=state["body"].prompts()),
        "check_prompt": lambda state: state.update(ids=frontend.completion_prompt(state["prompts"][0])),
        "request": lambda state: state.update(
            request=frontend.request(state["ids"], state["body"].sampling(1, None), True)
        ),
        "encode": lambda state: encoder.encode(state["request"]),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(NUM_WARMUP_RUNS + num_runs):
        state: dict[str, Any] = {}
        for name, step in steps.items():
            begin = time.perf_counter()
            step(state)
            times[name].append(time.perf_counter() - begin)
    result = {name: _median_ms(values[NUM_WARMUP_RUNS:]) for name, values in times.items()}
    result["total"] = round(sum(result.values()), 3)
    return result


def tiny_width(config: Any) -> Any:
    """`config`'s layers and vocabulary with small widths (the host work of a step, cheap math)."""
    return config.with_changes(
        hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=32
    )


def instrument_hit(node: Any) -> PartTimer:
    from mstar.engine.kv.layout import PagedLayout
    from mstar.engine.kv.pages import PageTable
    from mstar.llm import sampling
    from mstar.llm.runner import StagedInputs
    from mstar.llm.scheduler import StepPlan
    from mstar.llm.sequence import Sequence

    timer = PartTimer()
    timer.wrap(node, "prepare", "prepare")
    timer.wrap(node, "_launch", "launch (all below)")
    timer.wrap(node.scheduler, "schedule", "schedule")
    timer.wrap(Sequence, "page_hashes", "schedule: page_hashes (and register's)")
    timer.wrap(PageTable, "match_prefix", "schedule: match_prefix")
    timer.wrap(StepPlan, "layout", "plan.layout")
    timer.wrap(StagedInputs, "of", "stage inputs (one copy)")
    timer.wrap(PagedLayout, "as_decode_rows", "as_decode_rows")
    attention = node.runner.attention
    timer.wrap(attention, "plan", "attention.plan")
    timer.wrap(attention, "_host_rows", "attention.plan: write rows")
    timer.wrap(type(attention._ring[0]), "_plan_kernel", "attention.plan: kernel plan")
    if node.runner.graphs is not None:
        import torch

        timer.wrap(node.runner.graphs, "graph_layout", "graph_layout (with as_decode_rows)")
        timer.wrap(node.runner.graphs, "run", "graphs.run (with attention.plan)")
        timer.wrap(torch.cuda.CUDAGraph, "replay", "graphs.run: replay")
    timer.wrap(node.runner.model, "forward", "eager forward (with attention.plan)")
    timer.wrap(node.runner.sampler, "launch", "sampler.launch")
    timer.wrap(sampling.PendingSamples, "read", "samples.read")
    timer.wrap(node, "_emit", "emit")
    return timer


def one_request(node: Any, prompt: list[int], request_id: str) -> tuple[float, float, float]:
    """(prepare, queue, first token) ms of a one-token request: prepared, its step queued by the
    first forward (overlap leaves it in flight), then read back."""
    from mstar.graph import RequestState
    from mstar.llm.params import TextRequest, TextSampling

    params = TextRequest(prompt, TextSampling(max_tokens=1, ignore_eos=True, temperature=0.0), stream=True)
    state = RequestState(request_id, params)
    state.emit_output = lambda key, piece: None
    _synchronize()
    begin = time.perf_counter()
    node.prepare(state)
    prepared = time.perf_counter()
    node.forward([state])
    queued = time.perf_counter()
    while not node.check_stop(state):
        node.forward([state])
    _synchronize()
    done = time.perf_counter()
    node.release(state)
    return 1000 * (prepared - begin), 1000 * (queued - prepared), 1000 * (done - begin)


def node_ms(node: Any, vocab_size: int, num_shared: int, num_own: int, num_runs: int) -> dict[str, Any]:
    """A miss and a hit, each the median of `num_runs`: their prepare, queue and first-token ms and
    the host ms of each part of the timed request (the hit's system prompt is cached by a request
    just before it, not timed)."""
    rng = random.Random(1)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(vocab_size) for _ in range(count)]

    result: dict[str, Any] = {}
    for case in ("miss", "hit"):
        timings: list[tuple[float, float, float]] = []
        parts: dict[str, list[float]] = {}
        timer = None
        for run in range(NUM_WARMUP_RUNS + num_runs):
            if run == NUM_WARMUP_RUNS:
                timer = instrument_hit(node)
            shared = tokens(num_shared)
            if case == "hit":
                one_request(node, shared + tokens(num_own), f"{case}-{run}-first")
            before = dict(timer.seconds) if timer is not None else {}
            timing = one_request(node, shared + tokens(num_own), f"{case}-{run}")
            if timer is not None:
                timings.append(timing)
                for name, seconds in timer.seconds.items():
                    parts.setdefault(name, []).append(seconds - before.get(name, 0.0))
        if timer is not None:
            timer.restore()
        result[case] = {
            name: round(statistics.median(t[index] for t in timings), 3)
            for index, name in enumerate(("prepare_ms", "queue_ms", "first_token_ms"))
        }
        result[case]["host_ms"] = {name: _median_ms(values) for name, values in sorted(parts.items())}
    result["speedup"] = round(result["miss"]["first_token_ms"] / result["hit"]["first_token_ms"], 2)
    return result


def _median_ms(seconds: list[float]) -> float:
    return round(1000 * statistics.median(seconds), 3)


def main(argv: list[str] | None = None) -> int:
    import logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--shared-tokens", type=int, default=2048)
    parser.add_argument("--own-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile-mode", default="deterministic", help="the server's compile_mode")
    parser.add_argument("--tiny-width", action="store_true", help="the layers, with small widths")
    parser.add_argument("--max-num-seqs", type=int, default=1, help="the server's (the bench's c=1)")
    parser.add_argument("-o", "--output", default="llm-hit-profile.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from mstar.models.qwen3.config import QWEN3_CONFIGS

    config = QWEN3_CONFIGS[args.model]
    if args.tiny_width:
        config = tiny_width(config)
    num_prompt = args.shared_tokens + args.own_tokens
    result: dict[str, Any] = {"model": args.model, "tiny_width": args.tiny_width}
    result["shared_tokens"] = args.shared_tokens
    result["own_tokens"] = args.own_tokens
    result["front_ms"] = front_ms(config.vocab_size, num_prompt, config.max_position_embeddings, args.runs)
    print(json.dumps({"front_ms": result["front_ms"]}), flush=True)
    node, _ = build(args.model, args.max_num_seqs, args.device, args.compile_mode, config)
    result["node"] = node_ms(node, config.vocab_size, args.shared_tokens, args.own_tokens, args.runs)
    result["recompiles_after_warmup"] = node.num_recompiles()
    print(json.dumps(result, indent=1), flush=True)
    Path(args.output).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
