"""Where a DiT step's time goes: kernels by kind, the top kernels, and GPU idle time.

    python -m mstar.bench.profile --workloads wan-480p-cfg,zimage-1024-b1 \
        --compile-modes deterministic,default -o bench-results/profile.json

Our DiT (seeded random weights, the step benchmark's inputs) runs a few timed forwards (CUDA events),
then a few under torch.profiler. Kernels are grouped by kind from their names: GEMM (cuBLAS /
CUTLASS), attention (flash), triton (inductor's fused elementwise and reductions), copy (ATen copies
and cats) and other. "idle" is the step's wall time minus its kernel time: host work the GPU waited
for (packing, planning, launches). This is a diagnostic for speed work; the figures that count are
`mstar bench step` and the serving suite.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

KIND_PATTERNS = (
    ("attention", ("flash", "fmha", "attn")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "sm90_", "splitkreduce")),
    ("triton", ("triton",)),
    ("copy", ("copy", "cat", "elementwise_kernel_with_index")),
)
NUM_TOP_KERNELS = 25
NUM_TOP_HOST_FUNCTIONS = 30


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, patterns in KIND_PATTERNS:
        if any(pattern in lowered for pattern in patterns):
            return kind
    return "other"


def summarize_kernels(events: list[tuple[str, float]], num_steps: int) -> dict[str, Any]:
    """(kernel name, device us) per launch -> ms per step by kind, and the top kernels."""
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, list[float]] = defaultdict(list)
    for name, duration_us in events:
        by_kind[kernel_kind(name)] += duration_us
        by_name[name].append(duration_us)
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:NUM_TOP_KERNELS]
    return {
        "kernel_ms_per_step": sum(by_kind.values()) / 1000 / num_steps,
        "by_kind_ms": {kind: us / 1000 / num_steps for kind, us in sorted(by_kind.items())},
        "top_kernels": [
            {
                "name": name[:160],
                "kind": kernel_kind(name),
                "launches_per_step": len(times) / num_steps,
                "ms_per_step": sum(times) / 1000 / num_steps,
                "mean_us": sum(times) / len(times),
            }
            for name, times in top
        ],
    }


def kernel_events(fn, num_steps: int, device: str) -> list[tuple[str, float]]:
    """(kernel name, device us) of every launch in `num_steps` calls of fn, under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(num_steps):
            fn()
        if on_cuda:
            torch.cuda.synchronize()
    kernels = []
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            kernels.append((event.name, float(event.device_time)))
    return kernels


def host_profile(fn, num_steps: int, sync: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """Python's profiler over `num_steps` calls of fn, each started with the GPU's queue empty (sync
    outside the profiler): the functions with the most own time launching a step, per step."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    for _ in range(num_steps):
        sync()
        profiler.enable()
        fn()
        profiler.disable()
    sync()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, prim calls, own s, cum s, callers)}
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:NUM_TOP_HOST_FUNCTIONS]
    return [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "calls_per_step": calls / num_steps,
            "own_ms_per_step": own_s * 1000 / num_steps,
            "cumulative_ms_per_step": cumulative_s * 1000 / num_steps,
        }
        for (file, line, name), (calls, _, own_s, cumulative_s, _) in rows
    ]


def host_cpu_split(fn, num_steps: int, sync: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Launching a step (queue empty, no profiler): wall ms against the CPU ms of this thread and of
    the whole process (medians). Wall above this thread's CPU: it waited (a lock, the GPU's queue);
    process above thread: other threads were busy meanwhile. And the process's threads by name."""
    import threading
    import time

    from mstar.bench.stats import median

    wall, thread_cpu, process_cpu = [], [], []
    for _ in range(num_steps):
        sync()
        begin = time.perf_counter(), time.thread_time(), time.process_time()
        fn()
        end = time.perf_counter(), time.thread_time(), time.process_time()
        for series, first, last in zip((wall, thread_cpu, process_cpu), begin, end, strict=True):
            series.append((last - first) * 1000)
    sync()
    return {
        "wall_ms": median(wall),
        "thread_cpu_ms": median(thread_cpu),
        "process_cpu_ms": median(process_cpu),
        "threads": sorted(thread.name for thread in threading.enumerate()),
    }


def profile_family(
    names: list[str],
    mode: str,
    backend: str,
    num_timed: int,
    num_profiled: int,
    device: str = "cuda",
    num_host_profiled: int = 0,
) -> list[dict]:
    """Workloads of one family on one build of our DiT (one compile, the pack length dynamic)."""
    import torch

    from mstar.bench.baseline import step_workloads
    from mstar.bench.ours import build_ours
    from mstar.bench.step import time_forward

    known = step_workloads()
    entry, first = known[names[0]]
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    forward = build_ours(entry, entry.transformer_config(first.tiny), None, device, dtype, backend, mode)
    results = []
    for name in names:
        items = entry.example_items(known[name][1], device, dtype, seed=0)

        def step(items=items) -> None:
            with torch.inference_mode():
                forward(items)

        try:
            timing = time_forward(step, num_warmup=3, num_timed=num_timed, device=device)
            summary = summarize_kernels(kernel_events(step, num_profiled, device), num_profiled)
            if num_host_profiled:
                sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
                summary["host_cpu"] = host_cpu_split(step, max(num_host_profiled, 5), sync)
                summary["host_functions"] = host_profile(step, num_host_profiled, sync)
        except Exception as error:  # one failing workload keeps the others' figures
            results.append(
                {"workload": name, "compile_mode": mode, "error": f"{type(error).__name__}: {error}"}
            )
            continue
        summary["idle_ms_per_step"] = timing["median_ms"] - summary["kernel_ms_per_step"]
        results.append(
            {"workload": name, "compile_mode": mode, "attention_backend": backend, **timing, **summary}
        )
    return results


# (label, M, K, N): the token GEMMs of one step (Wan guidance pair 480p: 2 x 3510 tokens; Z-Image 1024:
# 4096 image + 32 caption tokens) with and without bias; what a kernel can reach on this GPU.
GEMM_SHAPES = (
    ("wan qkv", 7020, 3072, 9216, True),
    ("wan out", 7020, 3072, 3072, True),
    ("wan ffn up", 7020, 3072, 14336, True),
    ("wan ffn down", 7020, 14336, 3072, True),
    ("zimage qkv", 4128, 3840, 11520, False),
    ("zimage w13", 4128, 3840, 20480, False),
    ("zimage w2", 4128, 10240, 3840, False),
)


def gemm_table(num_timed: int = 20) -> list[dict]:
    """bf16 F.linear per shape: ms and TFLOP/s (and the FFN-up GEMM with cuBLASLt's GELU epilogue)."""
    import torch
    import torch.nn.functional as F

    from mstar.bench.step import time_forward

    rows = []
    for label, m, k, n, bias in GEMM_SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
        variants = [("linear", lambda x=x, w=w, b=b: F.linear(x, w, b))]
        if label == "wan ffn up":
            variants.append(
                ("addmm+gelu", lambda x=x, w=w, b=b: torch._addmm_activation(b, x, w.t(), use_gelu=True))
            )
            variants.append(
                ("linear, gelu", lambda x=x, w=w, b=b: F.gelu(F.linear(x, w, b), approximate="tanh"))
            )
        for variant, fn in variants:
            ms = time_forward(fn, num_warmup=3, num_timed=num_timed, device="cuda")["median_ms"]
            rows.append({"gemm": label, "variant": variant, "m": m, "k": k, "n": n, "ms": ms,
                         "tflops": 2 * m * k * n / ms / 1e9})  # fmt: skip
    return rows


def gemm_markdown(rows: list[dict]) -> str:
    lines = ["| gemm | variant | M x K x N | ms | TFLOP/s |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['gemm']} | {r['variant']} | {r['m']}x{r['k']}x{r['n']} | {r['ms']:.3f} | {r['tflops']:.0f} |"
        for r in rows
    ]
    return "\n".join(lines) + "\n"


def result_markdown(runs: list[dict]) -> str:
    lines = []
    for run in runs:
        if "error" in run:
            lines.append(f"### {run['workload']} ({run['compile_mode']}): failed: {run['error']}\n")
            continue
        kinds = ", ".join(f"{kind} {ms:.2f}" for kind, ms in run["by_kind_ms"].items())
        lines += [
            f"### {run['workload']} ({run['compile_mode']}, {run['attention_backend']})",
            f"step {run['median_ms']:.2f} ms = kernels {run['kernel_ms_per_step']:.2f} ms ({kinds})"
            f" + idle {run['idle_ms_per_step']:.2f} ms; host {run.get('host_median_ms', 0):.2f} ms;"
            f" first call {run['first_call_s']:.1f} s",
            "",
            "| kernel | kind | launches/step | ms/step | mean us |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| `{k['name'][:90]}` | {k['kind']} | {k['launches_per_step']:.0f} | {k['ms_per_step']:.2f}"
            f" | {k['mean_us']:.1f} |"
            for k in run["top_kernels"]
        ]
        lines.append("")
        if "host_cpu" in run:
            cpu = run["host_cpu"]
            lines += [
                f"host, launching a step: wall {cpu['wall_ms']:.2f} ms, this thread's CPU"
                f" {cpu['thread_cpu_ms']:.2f} ms, the process's CPU {cpu['process_cpu_ms']:.2f} ms;"
                f" threads: {', '.join(cpu['threads'])}",
                "",
            ]
        lines += host_markdown(run.get("host_functions", []))
    return "\n".join(lines)


def host_markdown(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["| host function | calls/step | own ms/step | cumulative ms/step |", "|---|---|---|---|"]
    lines += [
        f"| `{r['function'][:90]}` | {r['calls_per_step']:.0f} | {r['own_ms_per_step']:.3f}"
        f" | {r['cumulative_ms_per_step']:.3f} |"
        for r in rows
    ]
    return lines + [""]


def _profile_or_errors(names: list[str], mode: str, args: argparse.Namespace) -> list[dict]:
    try:
        return profile_family(
            names,
            mode,
            args.attention_backend,
            args.num_timed,
            args.num_profiled,
            args.device,
            args.num_host_profiled,
        )
    except Exception as error:  # a failed build keeps the other families' figures
        return [
            {"workload": n, "compile_mode": mode, "error": f"{type(error).__name__}: {error}"} for n in names
        ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mstar.bench.profile", description=__doc__)
    parser.add_argument("--workloads", default="wan-480p-cfg,zimage-1024-b1")
    parser.add_argument("--compile-modes", default="deterministic")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--num-timed", type=int, default=10)
    parser.add_argument("--num-profiled", type=int, default=3)
    parser.add_argument(
        "--num-host-profiled", type=int, default=0, help="steps under cProfile: the host's own time"
    )
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of the tool (tiny-* workloads)")
    parser.add_argument("--gemms", action="store_true", help="first, the step's GEMM shapes alone")
    parser.add_argument("-o", "--output", default="bench-results/profile.json")
    args = parser.parse_args(argv)
    import torch

    from mstar.bench.baseline import step_workloads
    from mstar.bench.env import env_info

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    gemms = gemm_table() if args.gemms else []
    if gemms:
        print(gemm_markdown(gemms), flush=True)
    known = step_workloads()
    families: dict[str, list[str]] = {}
    for name in args.workloads.split(","):
        entry, workload = known[name]
        families.setdefault(f"{entry.family}-{workload.tiny}", []).append(name)
    runs: list[dict] = []
    for names in families.values():
        for mode in args.compile_modes.split(","):
            found = _profile_or_errors(names, mode, args)
            runs += found
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # the family's model is gone: the next one starts clean
            record = {"runs": runs, "gemms": gemms, "env": env_info(sys.argv)}
            output.write_text(json.dumps(record, indent=2, default=str))  # kept if a later build dies
            print(result_markdown(found), flush=True)
    output.with_suffix(".md").write_text((gemm_markdown(gemms) if gemms else "") + result_markdown(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
