"""The LLM serving benchmark's client: streaming /v1/completions requests with token-id prompts, at
a fixed concurrency (closed loop), timing each request's first token and the gaps after it.

Token-id prompts (random ids, one draw per request, so no two share a prefix unless asked to) need
no tokenizer on the client and give exactly the prompt length asked for; `ignore_eos` makes every
request generate exactly max_tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import httpx

from mstar.bench.stats import median, percentile


@dataclass
class RequestTiming:
    ttft_s: float
    total_s: float
    num_output: int
    num_prompt: int
    num_cached: int

    @property
    def tpot_s(self) -> float | None:
        return (self.total_s - self.ttft_s) / (self.num_output - 1) if self.num_output > 1 else None


def random_prompts(
    count: int, num_tokens: int, vocab_size: int, seed: int, shared_prefix: list[int] = ()
) -> list[list[int]]:
    rng = random.Random(seed)
    # ids from the middle of the vocabulary: clear of special tokens at either end
    low, high = min(1000, vocab_size // 4), vocab_size - min(1000, vocab_size // 4)
    return [list(shared_prefix) + [rng.randrange(low, high) for _ in range(num_tokens)] for _ in range(count)]


async def stream_completion(
    client: httpx.AsyncClient, base_url: str, model: str | None, prompt: list[int], max_tokens: int
) -> RequestTiming:
    body = {
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if model:
        body["model"] = model
    started = time.perf_counter()
    first: float | None = None
    usage = {}
    async with client.stream("POST", f"{base_url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            elif chunk.get("choices") and first is None:
                first = time.perf_counter()
    total = time.perf_counter() - started
    return RequestTiming(
        (first or time.perf_counter()) - started, total, usage.get("completion_tokens", 0),
        usage.get("prompt_tokens", 0), usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
    )  # fmt: skip


async def closed_loop(
    base_url: str,
    model: str | None,
    prompts: list[list[int]],
    max_tokens: int,
    concurrency: int,
    timeout_s: float,
) -> tuple[list[RequestTiming], float]:
    """Every prompt once, `concurrency` in flight; (timings, wall seconds)."""
    queue = list(reversed(prompts))
    timings: list[RequestTiming] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:

        async def worker() -> None:
            while queue:
                prompt = queue.pop()
                timings.append(await stream_completion(client, base_url, model, prompt, max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return timings, time.perf_counter() - started


def summarize(timings: list[RequestTiming], wall_s: float, concurrency: int) -> dict:
    ttfts = [t.ttft_s * 1000 for t in timings]
    tpots = [t.tpot_s * 1000 for t in timings if t.tpot_s is not None]
    output = sum(t.num_output for t in timings)
    return {
        "concurrency": concurrency,
        "num_requests": len(timings),
        "output_tokens": output,
        "wall_s": round(wall_s, 3),
        "output_tokens_per_s": round(output / wall_s, 1) if wall_s else None,
        "ttft_ms_p50": _round(median(ttfts)),
        "ttft_ms_p99": _round(percentile(ttfts, 99)),
        "tpot_ms_p50": _round(median(tpots)),
        "tpot_ms_p99": _round(percentile(tpots, 99)),
    }


async def prefix_ttft(
    base_url: str,
    model: str | None,
    vocab_size: int,
    system_tokens: int,
    num_pairs: int,
    seed: int,
    timeout_s: float,
) -> dict:
    """TTFT of a request whose long system prompt is new (a miss) and of the next one sharing it (a
    hit), num_pairs times with fresh system prompts; one output token each."""
    cold, warm, cached = [], [], []
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        for pair in range(num_pairs):
            (system,) = random_prompts(1, system_tokens, vocab_size, seed + 1000 + pair)
            first, second = random_prompts(2, 32, vocab_size, seed + 2000 + pair, shared_prefix=system)
            miss = await stream_completion(client, base_url, model, first, 1)
            hit = await stream_completion(client, base_url, model, second, 1)
            cold.append(miss.ttft_s * 1000)
            warm.append(hit.ttft_s * 1000)
            cached.append(hit.num_cached)
    cold_ms, warm_ms = median(cold), median(warm)
    return {
        "system_prompt_tokens": system_tokens,
        "num_pairs": num_pairs,
        "ttft_ms_miss_p50": _round(cold_ms),
        "ttft_ms_hit_p50": _round(warm_ms),
        "speedup": round(cold_ms / warm_ms, 2) if warm_ms else None,
        "cached_tokens_p50": median(cached),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
