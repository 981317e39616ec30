"""Where an LLM decode step's host time goes: the LLM node driven in this process, on one device.

    python -m mstar.bench.llm_step_profile --model qwen3-0.6b --rows 1,32 -o llm-step-profile.json

For each row count: that many requests (random 512-token prompts, greedy or sampled) are
prefilled, then timed decode steps run back to back as the worker's step loop would call them. It
reports the wall ms a step (the pace the server decodes at), the host ms spent in each part of the
node's forward (scheduling, queueing the model, planning attention, sampling, reading back, text
and pieces), the device's busy ms a step (kernel time under torch.profiler) and every synchronizing
CUDA call with the code that made it (torch's sync debug mode). Before those, the wall ms of one
prefill step of a fresh prompt of each `--prefill-tokens` length. The node is the served one: the
model transformed and compiled under `--compile-mode` (the server's default unless given; "off" is
the eager reference). A diagnostic for speed work: the figures that count come from `mstar bench llm`.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

NUM_WARMUP_STEPS = 8
NUM_PROFILED_STEPS = 20
PROMPT_TOKENS = 512


class PartTimer:
    """Host seconds spent inside chosen methods, by name (nested parts count in both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._wrapped: list[tuple[Any, str, Any]] = []  # (owner, attribute, its own entry or None)

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)
        self._wrapped.append((owner, attribute, vars(owner).get(attribute)))

        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - begin

        setattr(owner, attribute, timed)

    def restore(self) -> None:
        """Put every wrapped method back as it was."""
        for owner, attribute, own in reversed(self._wrapped):
            if own is None:
                delattr(owner, attribute)  # an instance's method: the class's again
            else:
                setattr(owner, attribute, own)
        self._wrapped.clear()


def build(
    model_name: str, max_num_seqs: int, device: str, compile_mode: str, config: Any = None
) -> tuple[Any, Any]:
    """The node as the server builds it (mstar.models.qwen3.nodes: the speed-up transform under
    `compile_mode`, compiled at warmup before the decode graphs); `config` replaces the released
    shapes of `model_name` when given."""
    import torch

    from mstar.config import ServerConfig
    from mstar.graph import BuildContext
    from mstar.llm.build import use_one_cpu_thread
    from mstar.llm.tokenizer import ByteTokenizer
    from mstar.models.qwen3.config import QWEN3_CONFIGS
    from mstar.models.qwen3.nodes import build_qwen3_llm_node, load_qwen3

    use_one_cpu_thread(device)  # as the server's worker runs torch on a CPU (steady under load too)
    config = config or QWEN3_CONFIGS[model_name]
    model = load_qwen3(config, device, torch.bfloat16, folder=None, seed=0)
    server = ServerConfig(
        model=model_name, max_num_seqs=max_num_seqs, kv_pool_pages=2048, compile_mode=compile_mode
    )
    ctx = BuildContext(server, device, ("llm",))
    tokenizer = ByteTokenizer(config.vocab_size)
    node = build_qwen3_llm_node(ctx, config, model, tokenizer, (), 4096, torch.bfloat16)
    node.warmup()
    return node, config


def instrument(node: Any) -> PartTimer:
    from mstar.llm import sampling

    timer = PartTimer()
    timer.wrap(node, "forward", "forward")
    timer.wrap(node.scheduler, "schedule", "schedule")
    timer.wrap(node.scheduler, "advance", "advance")
    timer.wrap(node.scheduler, "register", "register")
    timer.wrap(node.runner, "launch", "runner.launch")
    timer.wrap(node.runner.attention, "plan", "attention.plan")
    timer.wrap(node.runner.sampler, "launch", "sampler.launch")
    if node.runner.graphs is not None:
        timer.wrap(node.runner.graphs, "run", "graphs.run")
    timer.wrap(sampling.PendingSamples, "read", "samples.read")
    timer.wrap(node, "_take_samples", "take_samples")
    timer.wrap(node, "_emit", "emit")
    return timer


def start_requests(node: Any, num_rows: int, vocab_size: int, sampled: bool, offset: int) -> list[Any]:
    import random

    from mstar.graph import RequestState
    from mstar.llm.params import TextRequest, TextSampling

    rng = random.Random(offset)
    knobs = {"temperature": 0.8, "top_p": 0.95, "seed": 1} if sampled else {"temperature": 0.0}
    states = []
    for index in range(num_rows):
        prompt = [rng.randrange(vocab_size) for _ in range(PROMPT_TOKENS)]
        params = TextRequest(prompt, TextSampling(max_tokens=4000, ignore_eos=True, **knobs), stream=True)
        state = RequestState(f"r{offset}-{index}", params)
        state.emit_output = lambda key, piece: None
        node.prepare(state)
        states.append(state)
    while any(node._generations[s.request_id].seq.num_outputs == 0 for s in states):
        node.forward(states)  # prefill (chunked under the step's token budget)
    return states


def _synchronize() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def sync_calls(node: Any, states: list[Any], num_steps: int) -> list[tuple[str, int]]:
    """Each synchronizing CUDA call in `num_steps` decode steps: where it came from, how often."""
    import torch

    if not torch.cuda.is_initialized():
        return []

    seen: Counter[str] = Counter()
    previous = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "mstar" in f.filename][-3:]
        seen[
            f"{str(message)[:80]} @ " + " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in frames)
        ] += 1

    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            for _ in range(num_steps):
                node.forward(states)
            torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = previous
    return seen.most_common(20)


def device_busy_ms(node: Any, states: list[Any], num_steps: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    _synchronize()
    import torch

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_initialized() else [])
    with profile(activities=activities) as prof:
        for _ in range(num_steps):
            node.forward(states)
        _synchronize()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    kernel_us = sum(e.self_device_time_total for e in kernels)
    top_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    top_kernels = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:25]
    return {
        "device_busy_ms_per_step": kernel_us / 1000 / num_steps,
        # where a step's device time goes (a kernel inside a replayed graph counts as itself)
        "top_device_kernels": [
            {
                "name": e.key[:120],
                "count_per_step": e.count / num_steps,
                "us_per_step": e.self_device_time_total / num_steps,
            }
            for e in top_kernels
        ],
        "top_host_ops": [
            {
                "name": e.key[:90],
                "count": e.count,
                "self_cpu_ms_per_step": e.self_cpu_time_total / 1000 / num_steps,
            }
            for e in top_host
        ],
    }


def profile_rows(node: Any, vocab_size: int, num_rows: int, sampled: bool, num_steps: int) -> dict[str, Any]:
    states = start_requests(node, num_rows, vocab_size, sampled, offset=num_rows * 2 + sampled)
    for _ in range(NUM_WARMUP_STEPS):
        node.forward(states)
    timer = instrument(node)
    _synchronize()
    begin = time.perf_counter()
    for _ in range(num_steps):
        node.forward(states)
    _synchronize()
    wall_ms = 1000 * (time.perf_counter() - begin) / num_steps
    parts = {name: round(1000 * s / num_steps, 3) for name, s in sorted(timer.seconds.items())}
    result = {
        "rows": num_rows,
        "sampled": sampled,
        "wall_ms_per_step": round(wall_ms, 3),
        "host_ms_per_step": parts,
    }
    result["sync_calls"] = sync_calls(node, states, NUM_PROFILED_STEPS)
    result.update(device_busy_ms(node, states, NUM_PROFILED_STEPS))
    for state in states:
        node.release(state)
    return result


def prefill_ms(node: Any, vocab_size: int, num_tokens: int, num_runs: int = 5) -> float:
    """Wall ms of one step that prefills a fresh `num_tokens`-token prompt (the median of a few):
    a short one is bound by the host's launches, a long one by the device."""
    import statistics

    from mstar.graph import RequestState
    from mstar.llm.params import TextRequest, TextSampling

    times = []
    for run in range(num_runs):
        prompt = [(run * 7919 + i) % vocab_size for i in range(num_tokens)]
        params = TextRequest(prompt, TextSampling(max_tokens=1, ignore_eos=True, temperature=0.0))
        state = RequestState(f"prefill-{num_tokens}-{run}", params)
        state.emit_output = lambda key, piece: None
        node.prepare(state)
        _synchronize()
        begin = time.perf_counter()
        while not node.check_stop(state):
            node.forward([state])
        _synchronize()
        times.append(1000 * (time.perf_counter() - begin))
        node.release(state)
    return round(statistics.median(times), 3)


def main(argv: list[str] | None = None) -> int:
    import logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--rows", default="1,32")
    parser.add_argument("--num-steps", type=int, default=100)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile-mode", default="deterministic", help="the server's compile_mode")
    parser.add_argument("--prefill-tokens", default="8,2048", help="prompt lengths of timed prefills")
    parser.add_argument("-o", "--output", default="llm-step-profile.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rows = [int(r) for r in args.rows.split(",")]
    node, config = build(args.model, max(rows), args.device, args.compile_mode)
    prefills = {n: prefill_ms(node, config.vocab_size, int(n)) for n in args.prefill_tokens.split(",")}
    print(json.dumps({"compile_mode": args.compile_mode, "prefill_ms": prefills}), flush=True)
    results = []
    for num_rows in rows:
        for sampled in (False, True):
            result = profile_rows(node, config.vocab_size, num_rows, sampled, args.num_steps)
            shown = {k: v for k, v in result.items() if k not in ("top_host_ops", "top_device_kernels")}
            print(json.dumps(shown, indent=1), flush=True)
            print(
                "  top host ops:",
                [(o["name"], round(o["self_cpu_ms_per_step"], 3)) for o in result["top_host_ops"][:12]],
            )
            for kernel in result["top_device_kernels"][:15]:
                print(
                    f"  device {kernel['us_per_step']:8.1f} us x{kernel['count_per_step']:.0f}  {kernel['name']}"
                )
            results.append(result)
    summary = {"model": args.model, "compile_mode": args.compile_mode, "prefill_ms": prefills}
    summary["recompiles_after_warmup"] = node.num_recompiles()
    print(json.dumps(summary), flush=True)
    Path(args.output).write_text(json.dumps({**summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
