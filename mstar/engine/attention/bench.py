"""Kernel timings of every available attention backend at the DiT shapes of the H200 table.

    python -m mstar.engine.attention.bench [--backends fa3,flashinfer,torch] [--iters 20]

Prints two markdown tables: ms per run() (CUDA events, bf16, non-causal, head dim 128) and the
host time of plan() for a miss (a new layout) and a skip (the layout already planned).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mstar.engine.attention.build import backend_candidates, build_attention
from mstar.engine.attention.layout import AttentionLayout
from mstar.engine.attention.platform import Libraries, detect_platform
from mstar.engine.attention.ragged import RaggedAttention

HEAD_DIM = 128
# (segment lengths, heads): Wan2.2-5B at 832x480x33 and 1280x704x121; Z-Image at 1024x1024
SHAPES = [
    ((3510,), 24),
    ((3510, 3510), 24),
    ((3510,) * 8, 24),
    ((27280,), 24),
    ((3510, 27280), 24),
    ((4224,), 30),
    ((4224,) * 4, 30),
]
PLAN_TIMING_LENS = (3510, 27280)


def time_run_ms(
    attention: RaggedAttention, lens: tuple[int, ...], num_heads: int, iters: int, warmup: int
) -> float:
    layout = AttentionLayout.self_attention(lens)
    q, k, v = (
        torch.randn(layout.total_q, num_heads, HEAD_DIM, device=attention.device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    attention.plan("bench", layout)
    for _ in range(warmup):
        attention.run("bench", q, k, v)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        attention.run("bench", q, k, v)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def time_plan_us(attention: RaggedAttention, num_heads: int, iters: int) -> tuple[float, float]:
    """Median host µs of plan(): (miss, skip). The wrapper has run once, so a miss includes the
    schedule a backend such as FlashInfer builds for known head shapes."""
    base = AttentionLayout.self_attention(PLAN_TIMING_LENS)
    q, k, v = (
        torch.randn(base.total_q, num_heads, HEAD_DIM, device=attention.device, dtype=torch.bfloat16)
        for _ in range(3)
    )
    for slot in range(attention.num_slots):  # every slot learns the head shape
        attention.plan(
            "plan", AttentionLayout.self_attention((PLAN_TIMING_LENS[0] + slot, PLAN_TIMING_LENS[1] - slot))
        )
        attention.run("plan", q, k, v)
    torch.cuda.synchronize()
    misses, skips = [], []
    for index in range(iters):
        # a new split of the same total each time: never held by a slot
        layout = AttentionLayout.self_attention(
            (PLAN_TIMING_LENS[0] + 100 + index, PLAN_TIMING_LENS[1] - 100 - index)
        )
        # An idle stream: a staging buffer still read by a queued copy would make the miss wait for
        # the GPU (serving plans a new layout into the slot used a step earlier, long copied).
        torch.cuda.synchronize()
        misses.append(_host_us(attention, layout))
        skips.append(_host_us(attention, layout))
        attention.run("plan", q, k, v)
    torch.cuda.synchronize()
    return statistics.median(misses), statistics.median(skips)


def _host_us(attention: RaggedAttention, layout: AttentionLayout) -> float:
    start = time.perf_counter()
    attention.plan("plan", layout)
    return (time.perf_counter() - start) * 1e6


def available_backends(names: list[str], flashinfer_backend: str) -> dict[str, RaggedAttention]:
    platform = detect_platform(torch.device("cuda"))
    built = {}
    for name in names:
        try:
            backend_candidates(name, platform, Libraries())
            built[name] = build_attention(name, "cuda", torch.bfloat16, flashinfer_backend=flashinfer_backend)
        except ValueError as error:
            print(f"<!-- {name}: skipped: {error} -->")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="fa3,flashinfer,torch")
    parser.add_argument("--flashinfer-backend", default="auto")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    backends = available_backends(args.backends.split(","), args.flashinfer_backend)
    names = list(backends)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, head dim {HEAD_DIM}, non-causal\n"
    )
    print("| segments (heads) | " + " | ".join(f"{backends[n].backend.version} ms" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for lens, num_heads in SHAPES:
        label = " + ".join(f"{n:,}" for n in lens) if len(set(lens)) > 1 else f"{len(lens)} x {lens[0]:,}"
        cells = [f"{time_run_ms(backends[n], lens, num_heads, args.iters, args.warmup):.2f}" for n in names]
        print(f"| {label} ({num_heads}) | " + " | ".join(cells) + " |")
    print(f"\nHost time of plan(), segments {PLAN_TIMING_LENS}, 24 heads (median of {args.iters}):\n")
    print("| backend | miss us | skip us |\n|---|---|---|")
    for name in names:
        miss_us, skip_us = time_plan_us(backends[name], 24, args.iters)
        print(f"| {backends[name].backend.version} | {miss_us:.1f} | {skip_us:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
