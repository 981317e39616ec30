"""DiT milliseconds per step: ours (each compile mode and attention backend) against diffusers'
transformer with the SAME random weights at the same shapes, with counted FLOPs and a roofline.

Per workload: diffusers' model is built from the real config with a seeded init; its state dict is
loaded into ours (keys identical by contract). Each implementation is timed with CUDA events after
warmup (median of N), and our output is compared with diffusers' output of the same run.
Without diffusers (our server run does not carry it) only ours is timed, and the result says so.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mstar.bench.baseline import diffusers_transformer, output_psnr_db, relative_error, step_workloads
from mstar.bench.stats import median
from mstar.models.bench_entry import DitBenchEntry, StepWorkload
from mstar.models.flops import FlopCount


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
    tiny: bool = False  # tiny configs (CPU tests); the tiny-* workloads take them either way
    skip_ours: bool = False
    skip_diffusers: bool = False  # ours alone even where diffusers is importable (no parity check)


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
    times_ms, host_times_ms = [], []
    for _ in range(num_timed):
        if on_cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            begin_s = time.perf_counter()
            fn()
            host_times_ms.append((time.perf_counter() - begin_s) * 1000)  # launching it, queue empty
            end.record()
            end.synchronize()
            times_ms.append(begin.elapsed_time(end))
        else:
            begin_s = time.perf_counter()
            fn()
            times_ms.append((time.perf_counter() - begin_s) * 1000)
            host_times_ms.append(times_ms[-1])
    return {
        "first_call_s": first_call_s,
        "median_ms": median(times_ms),
        "host_median_ms": median(host_times_ms),
        "min_ms": min(times_ms),
        "times_ms": times_ms,
    }


def _with_roofline(run: dict[str, Any], count: FlopCount) -> dict[str, Any]:
    seconds = run["median_ms"] / 1000
    run["tflops"] = count.total / seconds / 1e12
    run["roofline_fraction"] = count.roofline_s() / seconds
    return run


_STARTED_S = time.perf_counter()


def _progress(message: str) -> None:
    """One line on stderr as each stage ends: a call cut short by its time limit keeps what it
    measured (the JSON is written only at the end), and says where the time went."""
    print(f"step bench {time.perf_counter() - _STARTED_S:7.1f} s: {message}", file=sys.stderr, flush=True)


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class _Case:
    """One workload of a family run: its inputs, counted FLOPs and result entry."""

    workload: StepWorkload
    items: list[dict]
    count: FlopCount
    entry: dict[str, Any]
    reference: list | None = None  # diffusers' eager output


def _make_case(
    entry: DitBenchEntry, workload: StepWorkload, config: dict[str, Any], options: StepOptions
) -> _Case:
    import torch

    segments = entry.segments(workload)
    count = entry.count_flops(config, segments)
    items = entry.example_items(workload, options.device, getattr(torch, options.dtype), options.seed)
    entry_json: dict[str, Any] = {
        "workload": workload.name,
        "family": entry.family,
        "size": f"{workload.width}x{workload.height}x{workload.num_frames}",
        "num_items": workload.num_items,
        "num_tokens": sum(s.image_tokens for s in segments),
        "flops": {"gemm": count.gemm, "attention": count.attention, "total": count.total},
        "roofline_ms": count.roofline_s() * 1000,
        "runs": [],
    }
    return _Case(workload, items, count, entry_json)


def _timed_run(fn: Callable[[], Any], options: StepOptions, count: FlopCount, **labels: Any) -> dict:
    import torch

    on_cuda = options.device.startswith("cuda")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    run = {**labels, **time_forward(fn, options.num_warmup, options.num_timed, options.device)}
    run["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None
    run = _with_roofline(run, count)
    peak = f", peak {run['peak_memory_gib']:.1f} GiB" if on_cuda else ""
    _progress(f"{labels}: {run['median_ms']:.2f} ms (first call {run['first_call_s']:.1f} s{peak})")
    return run


def _guarded(notes: list[str], label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn's result, or None with a note when it fails (an OOM on one shape loses only that figure)."""
    try:
        return fn(*args, **kwargs)
    except Exception as error:
        notes.append(f"{label} failed: {type(error).__name__}: {error}")
        _free_memory()
        return None


def _run_diffusers(
    entry: DitBenchEntry, config: dict, cases: list[_Case], options: StepOptions, notes: list[str]
):
    """Times diffusers' transformer on every case in each mode; keeps its eager outputs as the
    references and returns its state dict (the weights ours gets)."""
    import torch

    try:
        import diffusers  # noqa: F401
    except ImportError:
        notes.append("diffusers is not importable here: ours is timed alone, with no parity check")
        return None
    dtype = getattr(torch, options.dtype)
    model = diffusers_transformer(entry, config, options.device, dtype, options.seed)
    _progress(f"{entry.family}: diffusers' transformer built")
    with torch.inference_mode():
        for case in cases:
            case.reference = _guarded(
                notes,
                f"{case.workload.name}: diffusers reference",
                entry.diffusers_forward,
                model,
                case.items,
            )
            _progress(f"{case.workload.name}: diffusers reference output")
        for mode in options.diffusers_modes:
            # static shapes: each size its own graph, as a user compiling for one size would get
            # (automatic dynamic shapes would recompile the second size with symbolic shapes)
            target = torch.compile(model, dynamic=False) if mode == "compiled" else model
            for case in cases:

                def forward(target=target, case=case) -> list:
                    return entry.diffusers_forward(target, case.items)

                run = _guarded(
                    notes,
                    f"{case.workload.name}: diffusers {mode}",
                    _timed_run,
                    forward,
                    options,
                    case.count,
                    impl="diffusers",
                    mode=mode,
                )
                if run is not None:
                    case.entry["runs"].append(run)
    state_dict = {k: v.detach() for k, v in model.state_dict().items()}
    del model
    _free_memory()
    return state_dict


def _run_ours(
    entry: DitBenchEntry, config, cases: list[_Case], options: StepOptions, notes: list[str], state_dict
) -> None:
    """One build of ours per (backend, compile mode), run on every case of the family: the layer
    stack compiles once with the pack length dynamic, as in serving."""
    import torch

    from mstar.bench.ours import OursUnavailable, build_ours

    dtype = getattr(torch, options.dtype)
    for backend in options.attention_backends:
        for mode in options.compile_modes:
            label = f"ours ({mode}, {backend})"
            try:
                forward = build_ours(
                    entry,
                    config,
                    state_dict,
                    options.device,
                    dtype,
                    backend,
                    mode,
                    options.seed,
                )
            except OursUnavailable as error:
                notes.append(f"{entry.family}: {label} not run: {error}")
                continue
            except Exception as error:  # e.g. a state-dict key mismatch: the diffusers figures still count
                notes.append(f"{entry.family}: {label} failed to build: {type(error).__name__}: {error}")
                continue
            _progress(f"{entry.family}: {label} built")
            for case in cases:
                _run_ours_case(forward, case, options, notes, label, mode=mode, attention_backend=backend)
            del forward
            _free_memory()


def _run_ours_case(
    forward, case: _Case, options: StepOptions, notes: list[str], label: str, **labels
) -> None:
    import torch

    try:
        with torch.inference_mode():
            output = forward(case.items)
            run = _timed_run(lambda: forward(case.items), options, case.count, impl="mstar", **labels)
    except Exception as error:  # one failing case must not lose the other figures of the run
        notes.append(f"{case.workload.name}: {label} failed: {type(error).__name__}: {error}")
        return
    reference = case.reference
    run["rel_error"] = relative_error(output, reference) if reference is not None else None
    run["psnr_db"] = output_psnr_db(output, reference) if reference is not None else None
    _progress(f"{case.workload.name}: {label} relative error {run['rel_error']}")
    case.entry["runs"].append(run)


def run_step_benchmark(options: StepOptions) -> dict[str, Any]:
    """Workloads of one family (and config size) share one diffusers build and one build of ours
    per mode; the families are the registry's (their bench entries)."""
    notes: list[str] = []
    known = step_workloads()
    groups: dict[tuple[str, bool], tuple[DitBenchEntry, list[StepWorkload]]] = {}
    for name in options.workloads:
        entry, workload = known[name]
        workload = dataclasses.replace(workload, tiny=True) if options.tiny else workload
        groups.setdefault((entry.family, workload.tiny), (entry, []))[1].append(workload)
    results: dict[str, dict] = {}
    for (_, tiny), (entry, workloads) in groups.items():
        config = entry.transformer_config(tiny)
        cases = [_make_case(entry, workload, config, options) for workload in workloads]
        state_dict = None if options.skip_diffusers else _run_diffusers(entry, config, cases, options, notes)
        if not options.skip_ours:
            _run_ours(entry, config, cases, options, notes, state_dict)
        results.update({case.workload.name: case.entry for case in cases})
        del cases, state_dict
        _free_memory()
    return {
        "benchmark": "step",
        "title": "DiT ms per step",
        "options": vars(options),
        "results": [results[name] for name in options.workloads],
        "notes": notes,
    }
