"""DiT milliseconds per step: ours (each compile mode and attention backend) against diffusers'
transformer with the SAME random weights at the same shapes, with counted FLOPs and a roofline.

Per workload: diffusers' model is built from the real config with a seeded init; its state dict is
loaded into ours (keys identical by contract). Each implementation is timed with CUDA events after
warmup (median of N), and our output is compared with diffusers' output of the same run.
Without diffusers (our server run does not carry it) only ours is timed, and the result says so.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mstar.bench import dit_inputs, flops
from mstar.bench.configs import configs_for
from mstar.bench.stats import median


@dataclass
class StepOptions:
    workloads: list[str]
    compile_modes: list[str] = field(default_factory=lambda: ["off", "deterministic"])
    attention_backends: list[str] = field(default_factory=lambda: ["auto"])
    diffusers_modes: list[str] = field(default_factory=lambda: ["eager"])  # and/or "compiled"
    num_warmup: int = 3
    num_timed: int = 10
    device: str = "cuda"
    dtype: str = "bfloat16"
    seed: int = 0
    tiny: bool = False  # tiny configs (CPU tests)
    skip_ours: bool = False


def time_forward(fn: Callable[[], Any], num_warmup: int, num_timed: int, device: str) -> dict[str, Any]:
    """First-call wall time (compile included), then per-call ms: CUDA events on GPU, wall clock on CPU."""
    import torch

    on_cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    start = time.perf_counter()
    fn()
    sync()
    first_call_s = time.perf_counter() - start
    for _ in range(max(0, num_warmup - 1)):
        fn()
    sync()
    times_ms = []
    for _ in range(num_timed):
        if on_cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times_ms.append(begin.elapsed_time(end))
        else:
            begin_s = time.perf_counter()
            fn()
            times_ms.append((time.perf_counter() - begin_s) * 1000)
    return {
        "first_call_s": first_call_s,
        "median_ms": median(times_ms),
        "min_ms": min(times_ms),
        "times_ms": times_ms,
    }


def _with_roofline(run: dict[str, Any], count: flops.FlopCount) -> dict[str, Any]:
    seconds = run["median_ms"] / 1000
    run["tflops"] = count.total / seconds / 1e12
    run["roofline_fraction"] = count.roofline_s() / seconds
    return run


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_workload(name: str, options: StepOptions, notes: list[str]) -> dict[str, Any]:
    import torch

    workload = dit_inputs.STEP_WORKLOADS[name]
    configs = configs_for(workload.family, tiny=options.tiny)
    dtype = getattr(torch, options.dtype)
    count = flops.count_forward(
        dit_inputs.arch(workload.family, configs["transformer"]), dit_inputs.segments(workload, configs)
    )
    items = dit_inputs.make_items(workload, configs, options.device, dtype, options.seed)
    entry: dict[str, Any] = {
        "workload": name,
        "family": workload.family,
        "size": f"{workload.width}x{workload.height}x{workload.num_frames}",
        "num_items": workload.num_items,
        "num_tokens": sum(s.image_tokens for s in dit_inputs.segments(workload, configs)),
        "flops": {"gemm": count.gemm, "attention": count.attention, "total": count.total},
        "roofline_ms": count.roofline_s() * 1000,
        "runs": [],
    }
    reference, state_dict = _run_diffusers(workload, configs, items, options, count, entry, notes)
    if not options.skip_ours:
        _run_ours(workload, configs, items, options, count, entry, notes, reference, state_dict)
    del state_dict, reference
    _free_memory()
    return entry


def _run_diffusers(workload, configs, items, options, count, entry, notes) -> tuple[list | None, dict | None]:
    """Times diffusers' transformer in each requested mode; returns its eager output and state dict."""
    import torch

    try:
        import diffusers  # noqa: F401
    except ImportError:
        notes.append("diffusers is not importable here: ours is timed alone, with no parity check")
        return None, None
    dtype = getattr(torch, options.dtype)
    model = dit_inputs.build_diffusers_transformer(
        workload.family, configs["transformer"], options.device, dtype, options.seed
    )
    with torch.inference_mode():
        reference = dit_inputs.diffusers_forward(workload.family, model, items)
        for mode in options.diffusers_modes:
            target = torch.compile(model) if mode == "compiled" else model
            timing = time_forward(
                lambda target=target: dit_inputs.diffusers_forward(workload.family, target, items),
                options.num_warmup, options.num_timed, options.device,
            )  # fmt: skip
            entry["runs"].append(_with_roofline({"impl": "diffusers", "mode": mode, **timing}, count))
    state_dict = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    _free_memory()
    return reference, state_dict


def _run_ours(workload, configs, items, options, count, entry, notes, reference, state_dict) -> None:
    import torch

    from mstar.bench.ours import OursUnavailable, build_ours

    dtype = getattr(torch, options.dtype)
    for backend in options.attention_backends:
        for mode in options.compile_modes:
            try:
                forward = build_ours(
                    workload.family,
                    configs["transformer"],
                    state_dict,
                    options.device,
                    dtype,
                    backend,
                    mode,
                    options.seed,
                )
            except OursUnavailable as error:
                notes.append(f"{workload.name}: ours ({mode}, {backend}) not run: {error}")
                continue
            try:
                with torch.inference_mode():
                    output = forward(items)
                    timing = time_forward(
                        lambda f=forward: f(items), options.num_warmup, options.num_timed, options.device
                    )
            except Exception as error:  # one failing mode must not lose the other figures of the run
                notes.append(
                    f"{workload.name}: ours ({mode}, {backend}) failed: {type(error).__name__}: {error}"
                )
                continue
            run = {"impl": "mstar", "mode": mode, "attention_backend": backend, **timing}
            run["rel_error"] = dit_inputs.relative_error(output, reference) if reference is not None else None
            entry["runs"].append(_with_roofline(run, count))
            del forward, output
            _free_memory()


def run_step_benchmark(options: StepOptions) -> dict[str, Any]:
    notes: list[str] = []
    results = [bench_workload(name, options, notes) for name in options.workloads]
    return {
        "benchmark": "step",
        "title": "DiT ms per step",
        "options": vars(options),
        "results": results,
        "notes": notes,
    }
