"""How the benchmarks time a call on the device: CUDA events around repeated calls."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def device_ms(fn: Callable[[], object], device: str, repeats: int = 20, warmup: int = 3) -> float:
    """ms a call of `fn` takes: CUDA events around `repeats` calls after `warmup` calls; off CUDA,
    one call's wall time (the benchmarks' CPU smoke tests)."""
    for _ in range(warmup):
        fn()
    if not str(device).startswith("cuda"):
        started = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - started)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats
