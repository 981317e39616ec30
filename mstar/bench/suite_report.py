"""Markdown of `mstar bench serve-suite` results (issue 8's serving profile) and the compact table
that bench/h200.sh prints last.

Where a run did not measure diffusers' pipeline itself, its figures come from /work/shared/H200.md
(diffusers 0.42.1 on the same H200, random weights of the real configs) and are marked so.
"""

from __future__ import annotations

import math
from typing import Any

H200_MD_MARK = "†"
H200_MD_NOTE = f"{H200_MD_MARK} diffusers figure from H200.md (not re-measured in this run)"
# diffusers 0.42.1 eager pipelines on the H200 (H200.md): p50 of one call, peak memory
H200_MD_DIFFUSERS = {
    "wan-480p-t2v": {"latency_p50_s": 11.70, "peak_memory_gib": 20.9},  # WanPipeline 832x480x33, 50 steps
    "zimage-1024": {"latency_p50_s": 1.42, "peak_memory_gib": 14.1},  # ZImagePipeline 1024x1024, 9 steps
}
TARGETS = {
    "cold_over_steady": 1.10,
    "mixed_p99_over_p50": 1.30,
    "throughput_ratio": {"video": 1.3, "image": 1.2},
}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}f}"
    return str(value)


def _kind(result: dict[str, Any]) -> str:
    return result["options"]["serve"]["kind"]


def _high(result: dict[str, Any]) -> int:
    return result["options"]["high_concurrency"]


def _parity_cell(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    if "error" in entry:
        return f"failed ({entry['error']})"
    same = "identical bytes" if entry.get("identical_bytes") else "bytes differ"
    psnr = entry.get("psnr_db")
    return f"{same}, {_fmt(psnr, 1)} dB" if psnr is not None else same


def _c1_stages_cell(result: dict[str, Any]) -> str:
    """Where a c=1 request's time went, ms: the client's mean, the server's e2e and walks (from its
    /metrics), the API's media encode after the request's end, and the arrival-to-media-ready time
    (the client's mean less it: transfer, and a video client's polling)."""
    steady = result.get("phases", {}).get("steady_c1") or {}
    server_ms = steady.get("server_ms_per_request") or {}
    if not server_ms or steady.get("latency_mean_s") is None:
        return "-"
    walks = ", ".join(f"{name[5:]} {ms:.0f}" for name, ms in server_ms.items() if name.startswith("walk:"))
    return (
        f"client {1000 * steady['latency_mean_s']:.0f}; server e2e {_fmt(server_ms.get('e2e'), 0)} "
        f"(walks: {walks}); media encode {_fmt(server_ms.get('encode'), 1)}; "
        f"media ready {_fmt(server_ms.get('ready'), 0)}"
    )


def summary_rows(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, value, target) of the headline figures."""
    s, kind, high = result.get("summary", {}), _kind(result), _high(result)
    throughput_target = TARGETS["throughput_ratio"][kind]
    parity = result.get("parity", {})
    rows = [
        ("boot to /ready s", _fmt(s.get("boot_s"), 1), ""),
        ("cold (first request after /ready) s", _fmt(s.get("cold_latency_s")), ""),
        ("steady c=1 p50 s", _fmt(s.get("steady_p50_s")), ""),
        ("cold / steady", _fmt(s.get("cold_over_steady")), f"<= {TARGETS['cold_over_steady']:.2f}"),
        ("c=1 ms a request (mean)", _c1_stages_cell(result), ""),
        ("per min c=1", _fmt(s.get("per_minute_c1")), ""),
        (f"per min c={high}", _fmt(s.get(f"per_minute_c{high}")), ""),
        (f"c={high} / c=1 throughput", _fmt(s.get("throughput_ratio")), f">= {throughput_target}"),
        ("mixed p50 / p99 s", f"{_fmt(s.get('mixed_p50_s'))} / {_fmt(s.get('mixed_p99_s'))}", ""),
        ("mixed p99 / p50", _fmt(s.get("mixed_p99_over_p50")), f"<= {TARGETS['mixed_p99_over_p50']:.2f}"),
        (
            "recompiles: mixed run / all traffic",
            f"{_fmt(s.get('recompiles_in_mixed'))} / {_fmt(s.get('recompiles_in_traffic'))}",
            "0",
        ),
        ("peak GPU memory GiB", _fmt(s.get("peak_gpu_memory_gib"), 1), ""),
        ("peak GPU memory at c=1 GiB", _fmt(s.get("peak_gpu_memory_c1_gib"), 1), ""),
        ("peak GPU memory allocated (torch) at c=1 GiB", _fmt(s.get("peak_gpu_allocated_c1_gib"), 1), ""),
        ("parity: repeat alone", _parity_cell(parity.get("repeat_alone")), "inf"),
    ]
    rows += [
        (f"parity: alone vs {name}", _parity_cell(entry), "inf")
        for name, entry in parity.items()
        if name != "repeat_alone"
    ]
    if kind == "video":
        rows.append(("parity note", "MP4 is lossy: pixel parity not measured through the server", ""))
    rows += [("skipped (time guard)", note, "") for note in result.get("skipped", [])]
    return rows


def suite_table(result: dict[str, Any]) -> str:
    lines = ["| metric | value | target |", "|---|---|---|"]
    lines += [f"| {metric} | {value} | {target} |" for metric, value, target in summary_rows(result)]
    return "\n".join(lines)


def _measured(workload: str, pipelines: list[dict], mode: str) -> dict[str, Any]:
    """diffusers' run of `workload` in `mode` (eager | compiled) in this set of results, or {}."""
    for run in pipelines:
        if run.get("workload") == workload and run.get("mode") == mode:
            return run
    return {}


def _baseline(workload: str, pipelines: list[dict]) -> tuple[dict[str, Any], str]:
    """diffusers eager measured in this set of results, else H200.md's figure (marked)."""
    run = _measured(workload, pipelines, "eager")
    return (run, "") if run else (H200_MD_DIFFUSERS.get(workload, {}), H200_MD_MARK)


def _per_minute(latency_s: float | None) -> float | None:
    return 60.0 / latency_s if latency_s else None


def _cell(value: Any, mark: str, digits: int = 2) -> str:
    return "-" if value is None else f"{_fmt(value, digits)}{mark}"


def _times(baseline: float | None, ours: float | None) -> str:
    return f"{baseline / ours:.2f}x" if baseline and ours else "-"


def _eager_and_compiled(eager_ratio: str, compiled_ratio: str | None) -> str:
    """The ratio against diffusers eager, and against compiled where that was measured."""
    return eager_ratio if compiled_ratio is None else f"{eager_ratio} eager, {compiled_ratio} compiled"


def suite_comparison_rows(result: dict[str, Any], pipelines: list[dict]) -> list[str]:
    """Rows of docs/benchmarks.md's comparison table (ratio = diffusers / ours for times)."""
    workload = result.get("workload") or result["options"]["serve"].get("model") or "serve"
    s, kind, high = result.get("summary", {}), _kind(result), _high(result)
    base, mark = _baseline(workload, pipelines)
    base_s = base.get("latency_p50_s")
    compiled_s = _measured(workload, pipelines, "compiled").get("latency_p50_s")
    base_per_min, compiled_per_min = _per_minute(base_s), _per_minute(compiled_s)
    steady_s = s.get("steady_p50_s")
    per_min = {1: s.get("per_minute_c1"), high: s.get(f"per_minute_c{high}")}
    rows = [
        f"| {workload} server boot to /ready | s | {_fmt(s.get('boot_s'), 1)} | - | - | - | - |",
        f"| {workload} first request after /ready (cold) | s | {_fmt(s.get('cold_latency_s'))} | - | - | "
        f"cold/steady {_fmt(s.get('cold_over_steady'))} (target <= 1.10) | - |",
        f"| {workload} server end to end, c=1 | p50 s | {_fmt(steady_s)} | {_cell(base_s, mark)} | "
        f"{_cell(compiled_s, '')} | "
        f"{_eager_and_compiled(_times(base_s, steady_s), compiled_s and _times(compiled_s, steady_s))} | - |",
    ]
    for concurrency, value in per_min.items():
        rows.append(
            f"| {workload} server throughput, c={concurrency} (diffusers: sequential) | per min | {_fmt(value)} | "
            f"{_cell(base_per_min, mark)} | {_cell(compiled_per_min, '')} | "
            f"{_eager_and_compiled(_times(value, base_per_min), compiled_per_min and _times(value, compiled_per_min))}"
            " | - |"
        )
    rows += [
        f"| {workload} c={high} / c=1 throughput | ratio | {_fmt(s.get('throughput_ratio'))} | - | - | "
        f"target >= {TARGETS['throughput_ratio'][kind]} | - |",
        f"| {workload} mixed sizes, c={high} | p50 / p99 s | {_fmt(s.get('mixed_p50_s'))} / {_fmt(s.get('mixed_p99_s'))} | "
        f"- | - | p99/p50 {_fmt(s.get('mixed_p99_over_p50'))} (target <= 1.30) | - |",
        f"| {workload} recompiles in traffic (mixed run) | count | {_fmt(s.get('recompiles_in_traffic'))} "
        f"({_fmt(s.get('recompiles_in_mixed'))}) | - | - | target 0 | - |",
        f"| {workload} peak GPU memory while serving | GiB | {_fmt(s.get('peak_gpu_memory_gib'), 1)} | "
        f"{_cell(base.get('peak_memory_gib'), mark, 1)} | - | - | - |",
        f"| {workload} peak GPU memory during the c=1 phase (device-wide) | GiB | "
        f"{_fmt(s.get('peak_gpu_memory_c1_gib'), 1)} | {_cell(base.get('peak_memory_gib'), mark, 1)} | - | - | - |",
        f"| {workload} peak GPU memory allocated by torch during the c=1 phase (as diffusers') | GiB | "
        f"{_fmt(s.get('peak_gpu_allocated_c1_gib'), 1)} | {_cell(base.get('peak_memory_gib'), mark, 1)} | - | - | - |",
    ]
    parity = result.get("parity", {})
    for name, entry in parity.items():
        rows.append(
            f"| {workload} same seed: alone vs {name.replace('_', ' ')} | PSNR | {_parity_cell(entry)} | - | - | target inf | - |"
        )
    if kind == "video":
        rows.append(
            f"| {workload} same-seed pixel parity | PSNR | not measured through the server (MP4 is lossy) | - | - | - | - |"
        )
    return rows


def compact_table(results: list[dict[str, Any]]) -> str:
    """One short table per result: what bench/h200.sh prints last."""
    from mstar.bench.report import diffusers_table, serve_table

    parts = []
    for result in results:
        name = result["benchmark"]
        if name == "serve-suite":
            table = suite_table(result)
        elif name == "step":
            table = _compact_step_table(result)
        elif name == "parity":
            from mstar.bench.parity import parity_table

            table = parity_table(result)
        else:
            table = serve_table(result) if name == "serve" else diffusers_table(result)
        notes = "".join(f"\n- {note}" for note in result.get("notes", []))
        parts.append(f"### {name}: {result.get('workload') or result.get('title', '')}\n\n{table}{notes}\n")
    return "\n".join(parts)


def _compact_step_table(result: dict[str, Any]) -> str:
    lines = [
        "| workload | implementation | median ms | TFLOP/s | roofline | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for entry in result["results"]:
        for run in entry["runs"]:
            label = f"{run['impl']} {run['mode']} / {run.get('attention_backend', '-')}"
            lines.append(
                f"| {entry['workload']} | {label} | {_fmt(run.get('median_ms'))} | {_fmt(run.get('tflops'), 0)} | "
                f"{_fmt(run.get('roofline_fraction'))} | {_fmt(run.get('peak_memory_gib'), 1)} |"
            )
    return "\n".join(lines)
