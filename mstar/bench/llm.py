"""`mstar bench llm`: LLM serving against transformers' batched generate, in one run.

1. Boots `mstar serve` in a process of its own (random weights of the named Qwen3 size, on the GPU),
   unless --base-url names a running one.
2. Closed loop at each concurrency: streaming /v1/completions, P-token prompts (random ids), exactly
   O output tokens (EOS ignored), greedy: output tokens/s, TTFT p50/p99, TPOT p50.
3. Prefix cache: TTFT of a request with a fresh S-token system prompt (a miss) and of the next one
   sharing it (a hit).
4. The c=1 decode floor: the bytes one decode step must read (every weight once, but one row of an
   untied input embedding, and the KV of the average context) over the device's copy bandwidth
   (4.3 TB/s on the H200).
5. Shuts the server down, then transformers' Qwen3ForCausalLM `generate` on the same weights at the
   same batch sizes (skip with --skip-baseline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mstar.bench.llm_load import closed_loop, prefix_ttft, random_prompts, summarize

H200_COPY_BYTES_PER_S = 4.3e12


@dataclass
class LLMOptions:
    model: str = "qwen3-0.6b"
    device: str = "cuda"
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 128])
    prompt_tokens: int = 512
    output_tokens: int = 256
    system_prompt_tokens: int = 2048
    num_prefix_pairs: int = 5
    base_url: str | None = None
    kv_attention_backend: str = "auto"
    cuda_graphs: bool = True
    compile_cache_dir: str | None = None
    copy_bytes_per_s: float = H200_COPY_BYTES_PER_S
    skip_baseline: bool = False
    server_log: str | None = None  # the local server's log (default: this process's stderr)
    seed: int = 0
    request_timeout_s: float = 600.0


def num_requests(concurrency: int) -> int:
    """Enough for a steady state: two full waves, at least 4."""
    return max(4, 2 * concurrency)


@contextlib.contextmanager
def local_server(options: LLMOptions, log_path: str | None = None) -> Iterator[tuple[str, float]]:
    """`mstar serve` in a process of its own (the load client must not share its interpreter) on a
    free port; yields (base URL, seconds to ready). Its log goes to `log_path` (else stderr)."""
    import yaml

    top = max(options.concurrency)
    config = {
        "model": options.model, "random_weights": True, "device": options.device, "port": 0,
        "max_concurrent_requests": 2 * top, "max_queue_size": 4096, "max_num_seqs": top,
        "request_timeout_s": options.request_timeout_s, "kv_attention_backend": options.kv_attention_backend,
        "cuda_graphs": options.cuda_graphs, "compile_cache_dir": options.compile_cache_dir,
    }  # fmt: skip
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        config_path = os.path.join(folder, "server.yaml")
        with open(config_path, "w") as handle:
            yaml.safe_dump(config, handle)
        log = open(log_path, "w") if log_path else None  # noqa: SIM115 (closed below)
        server = subprocess.Popen(
            [sys.executable, "-m", "mstar.cli", "serve", "--config", config_path],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )  # fmt: skip
        try:
            base_url = _announced_url(server)
            yield base_url, time.monotonic() - started
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=120)
            except subprocess.TimeoutExpired:
                server.kill()
            if log is not None:
                log.close()


def _announced_url(server: subprocess.Popen) -> str:
    """The URL in `mstar serve`'s "serving ... on http://HOST:PORT" line (printed once ready)."""
    for line in server.stdout:
        match = re.search(r"on (http://[\d.]+:\d+)", line)
        if "serving" in line and match:
            drain = threading.Thread(target=server.stdout.read, name="server-stdout", daemon=True)
            drain.start()  # nothing blocks on a full pipe later
            return match.group(1)
    raise RuntimeError(f"the server exited (status {server.wait()}) before serving; see its log")


def decode_floor(config: Any, context_tokens: int, copy_bytes_per_s: float) -> dict[str, float]:
    """The c=1 decode step's memory floor: the bf16 weights a token reads (each once; one row of
    an untied input embedding) plus the KV of `context_tokens`."""
    weight_bytes = config.num_parameters_read_per_token() * 2
    kv_bytes = (
        2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 * context_tokens
    )
    return {
        "weight_gb": round(weight_bytes / 1e9, 3),
        "kv_gb_at_context": round(kv_bytes / 1e9, 4),
        "context_tokens": context_tokens,
        "floor_ms": round((weight_bytes + kv_bytes) / copy_bytes_per_s * 1000, 3),
    }


async def _serve_phases(options: LLMOptions, base_url: str, vocab_size: int) -> dict[str, Any]:
    warm = random_prompts(2, options.prompt_tokens, vocab_size, options.seed + 99)
    await closed_loop(base_url, None, warm, 8, 2, options.request_timeout_s)
    levels = []
    for concurrency in options.concurrency:
        prompts = random_prompts(
            num_requests(concurrency), options.prompt_tokens, vocab_size, options.seed + concurrency
        )
        before = await _step_seconds(base_url)
        timings, wall_s = await closed_loop(
            base_url, None, prompts, options.output_tokens, concurrency, options.request_timeout_s
        )
        levels.append(summarize(timings, wall_s, concurrency))
        levels[-1].update(_step_split(before, await _step_seconds(base_url), len(prompts)))
        print(f"c={concurrency}: {levels[-1]}", flush=True)
    prefix = await prefix_ttft(
        base_url, None, vocab_size, options.system_prompt_tokens, options.num_prefix_pairs, options.seed,
        options.request_timeout_s,
    )  # fmt: skip
    print(f"prefix cache: {prefix}", flush=True)
    return {"levels": levels, "prefix_cache": prefix}


async def _step_seconds(base_url: str) -> dict[str, list[float]]:
    """The server's step times so far, per node ({} from a server without our /metrics)."""
    import httpx

    from mstar.bench.server_metrics import node_seconds_from_metrics, scrape_metrics

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        text = await scrape_metrics(client)
    return node_seconds_from_metrics(text) if text else {}


def _step_split(before: dict, after: dict, num_requests: int) -> dict[str, float]:
    """Where a level's time went on the server: the LLM node's steps, their device ms (CUDA events)
    and host ms (the forward call: queueing step n + 1, reading step n back, its text and pieces)."""
    from mstar.bench.server_metrics import node_breakdown

    split = node_breakdown(before, after, num_requests).get("llm")
    if split is None:
        return {}
    return {
        "steps": round(split["steps_per_request"] * num_requests),
        "step_device_ms": round(split["ms_per_step"], 3),
        "step_host_ms": round(split["host_ms_per_step"], 3),
    }


def run_llm_benchmark(options: LLMOptions) -> dict[str, Any]:
    from mstar.config import ServerConfig
    from mstar.models.registry import get_model_spec

    config = get_model_spec(options.model).model_config(ServerConfig(model=options.model))
    result: dict[str, Any] = {
        "benchmark": "llm",
        "title": f"{options.model}, random weights, bf16",
        "options": options.__dict__,
    }
    if options.base_url is not None:
        result.update(asyncio.run(_serve_phases(options, options.base_url, config.vocab_size)))
    else:
        with local_server(options, options.server_log) as (base_url, boot_s):
            result["boot_s"] = round(boot_s, 1)
            result.update(asyncio.run(_serve_phases(options, base_url, config.vocab_size)))
    floor = decode_floor(config, options.prompt_tokens + options.output_tokens // 2, options.copy_bytes_per_s)
    c1 = next((level for level in result["levels"] if level["concurrency"] == 1), None)
    if c1 and c1["tpot_ms_p50"]:
        floor["share_of_floor_at_c1"] = round(floor["floor_ms"] / c1["tpot_ms_p50"], 3)
    result["decode_floor"] = floor
    if not options.skip_baseline:
        from mstar.bench.llm_baseline import run_baseline

        result["transformers"] = run_baseline(
            options.model,
            config,
            options.device,
            options.concurrency,
            options.prompt_tokens,
            options.output_tokens,
            options.seed,
        )
        for level, base in zip(result["levels"], result["transformers"], strict=False):
            if base["output_tokens_per_s"]:
                level["vs_transformers"] = round(
                    level["output_tokens_per_s"] / base["output_tokens_per_s"], 2
                )
    return result


def llm_table(result: dict[str, Any]) -> str:
    baseline = {row["batch_size"]: row for row in result.get("transformers", [])}
    lines = [
        "| c | requests | output tok/s | transformers tok/s | x | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
        "| step device / host ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for level in result.get("levels", []):
        base = baseline.get(level["concurrency"], {})
        lines.append(
            f"| {level['concurrency']} | {level['num_requests']} | {level['output_tokens_per_s']} | "
            f"{base.get('output_tokens_per_s', '-')} | {level.get('vs_transformers', '-')} | {level['ttft_ms_p50']} | "
            f"{level['ttft_ms_p99']} | {level['tpot_ms_p50']} | "
            f"{level.get('step_device_ms', '-')} / {level.get('step_host_ms', '-')} |"
        )
    floor, prefix = result.get("decode_floor", {}), result.get("prefix_cache", {})
    lines.append("")
    lines.append(
        f"c=1 decode floor: {floor.get('floor_ms')} ms a token ({floor.get('weight_gb')} GB of weights, "
        f"KV at {floor.get('context_tokens')} tokens); measured TPOT is {floor.get('share_of_floor_at_c1')} of it."
    )
    lines.append(
        f"{prefix.get('system_prompt_tokens')}-token shared system prompt: TTFT {prefix.get('ttft_ms_miss_p50')} ms "
        f"on a miss, {prefix.get('ttft_ms_hit_p50')} ms on a hit ({prefix.get('speedup')}x)."
    )
    return "\n".join(lines)
