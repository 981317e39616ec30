"""The end-to-end baseline: each registered family's diffusers pipeline (its bench entry: WanPipeline,
ZImagePipeline) with random weights of the real configs, the same seeds, steps, guidance and sizes
as our serving benchmark's workloads.

Text encoders are timed apart: seeded prompt embeddings are passed in,
so both sides time the DiT loop, the VAE decode and post-processing. Each workload runs eager and
then with the transformer under torch.compile (first call reported apart), sequentially at c=1.
Mode "regional" is diffusers' regional compile instead (`compile_repeated_blocks`: the model's
repeated block compiled once and reused), for transformers whose whole-model compile runs longer
than a benchmark call (LTX-2's 48 unrolled blocks).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mstar.bench.baseline import e2e_workloads
from mstar.bench.stats import percentile
from mstar.models.bench_entry import DitBenchEntry, EndToEndWorkload


@dataclass
class PipelineOptions:
    workloads: list[str]
    modes: list[str] = field(default_factory=lambda: ["eager", "compiled"])
    num_warmup: int = 1
    num_timed: int = 3
    num_inference_steps: int | None = None  # override every workload's steps (quick runs)
    device: str = "cuda"
    seed: int = 0


def build_pipeline(workload_name: str, device: str, seed: int, dit_dtype: Any = None) -> Any:
    """The family's diffusers pipeline with seeded random weights: DiT in bf16 on GPU (cast as
    from_pretrained(torch_dtype=bf16) would: its _keep_in_fp32_modules stay fp32), no text encoder or
    tokenizer (embeddings are passed in)."""
    import torch

    entry, workload = e2e_workloads()[workload_name]
    if dit_dtype is None:
        dit_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(seed)
    return entry.diffusers_pipeline(workload, device, seed, dit_dtype)


def _call_kwargs(
    entry: DitBenchEntry, workload: EndToEndWorkload, options: PipelineOptions, dtype: Any
) -> dict[str, Any]:
    import torch

    kwargs = entry.pipeline_inputs(workload, options.device, options.seed, dtype)
    kwargs.update(
        width=workload.width,
        height=workload.height,
        num_inference_steps=options.num_inference_steps or workload.num_inference_steps,
        guidance_scale=workload.guidance_scale,
        output_type="np",
        generator=torch.Generator().manual_seed(options.seed),
    )
    return kwargs


def _timed_call(pipe: Any, kwargs: dict[str, Any], device: str) -> float:
    import torch

    start = time.perf_counter()
    pipe(**kwargs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench_pipeline_mode(
    pipe: Any, entry: DitBenchEntry, workload: EndToEndWorkload, mode: str, options: PipelineOptions
) -> dict[str, Any]:
    import torch

    on_cuda = options.device.startswith("cuda")
    if mode == "compiled":
        pipe.transformer.compile()
    elif mode == "regional":  # diffusers' regional compile: its repeated block compiled once, reused
        pipe.transformer.compile_repeated_blocks()
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    dtype = pipe.transformer.dtype
    first_call_s = _timed_call(pipe, _call_kwargs(entry, workload, options, dtype), options.device)
    for _ in range(max(0, options.num_warmup - 1)):
        _timed_call(pipe, _call_kwargs(entry, workload, options, dtype), options.device)
    latencies_s = [
        _timed_call(pipe, _call_kwargs(entry, workload, options, dtype), options.device)
        for _ in range(options.num_timed)
    ]
    return {
        "workload": workload.name,
        "mode": mode,
        "kind": workload.kind,
        "size": f"{workload.width}x{workload.height}x{workload.num_frames}",
        "num_inference_steps": options.num_inference_steps or workload.num_inference_steps,
        "guidance_scale": workload.guidance_scale,
        "first_call_s": first_call_s,
        "latencies_s": latencies_s,
        "latency_p50_s": percentile(latencies_s, 50),
        "sequential_per_minute": 60.0 * len(latencies_s) / sum(latencies_s) if latencies_s else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None,
    }


PIPELINE_MODES = ("eager", "compiled", "regional")


def run_pipeline_benchmark(options: PipelineOptions) -> dict[str, Any]:
    import torch

    if unknown := [mode for mode in options.modes if mode not in PIPELINE_MODES]:
        raise ValueError(f"pipeline modes: unknown {unknown}; choose from {list(PIPELINE_MODES)}")
    results = []
    for name in options.workloads:
        entry, workload = e2e_workloads()[name]
        pipe = build_pipeline(name, options.device, options.seed)
        with torch.inference_mode():
            for mode in options.modes:  # eager first: compiling changes the module in place
                results.append(bench_pipeline_mode(pipe, entry, workload, mode, options))
        del pipe
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    notes = ["text encoders timed apart: seeded prompt embeddings passed in (UMT5 / Qwen3 outputs)"]
    return {
        "benchmark": "diffusers",
        "title": "diffusers pipelines end to end",
        "options": vars(options),
        "results": results,
        "notes": notes,
    }
