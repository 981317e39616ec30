"""Markdown from benchmark JSON: one table per result file, and the docs/benchmarks.md history.

docs/benchmarks.md keeps one section per measurement run, newest first. Each section has the
comparison table (ours, diffusers eager and compiled, ratio, fraction of roofline), the date,
GPU, versions and the exact commands. `update_benchmarks_doc` inserts a new section above the
older ones and never rewrites them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DOC_HEADER = """# Benchmarks

Every figure is measured side by side with a baseline in the same run, on the GPU named, with the
commands given. Ratio = baseline time / mstar time (above 1: mstar is faster). Fraction of roofline
= counted FLOPs at the measured ceilings (bf16 GEMM 780 TFLOP/s, fa3 attention 660 TFLOP/s) over
the measured time. Newest first; older runs are kept below.
"""
RUNS_MARKER = "<!-- runs: newest first -->"
NO_RUNS_YET = "_No run recorded yet._"
COMPARISON_HEADER = (
    "| workload | metric | mstar | diffusers eager | diffusers compiled | ratio | fraction of roofline |\n"
    "|---|---|---|---|---|---|---|"
)


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _ratio(baseline: float | None, ours: float | None) -> str:
    if not baseline or not ours:
        return "-"
    return f"{baseline / ours:.2f}x"


def serve_table(result: dict[str, Any]) -> str:
    kind = result["options"]["kind"]
    unit = "images" if kind == "image" else "videos"
    lines = [
        f"| mode | c / rate | done / sent | p50 s | p95 s | p99 s | first progress p50 s | {unit}/min | errors | peak GPU GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        if run["mode"] == "warmup":
            continue
        load = f"c={run['concurrency']}" if run["mode"] == "closed" else f"{run['request_rate']}/s"
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(run["errors"].items())) or "none"
        lines.append(
            f"| {run['mode']} | {load} | {run['num_completed']} / {run['num_requests']} | "
            f"{fmt(run['latency_p50_s'])} | {fmt(run['latency_p95_s'])} | {fmt(run['latency_p99_s'])} | "
            f"{fmt(run['first_progress_p50_s'])} | {fmt(run[f'{unit}_per_minute'])} | {errors} | "
            f"{fmt(run['peak_gpu_memory_gib'], 1)} |"
        )
    return "\n".join(lines)


def step_table(result: dict[str, Any]) -> str:
    """One row per implementation; the counted work and its roofline time lead each workload."""
    lines = [
        "| workload | tokens | counted TFLOP | roofline ms | implementation | median ms | TFLOP/s "
        "| fraction of roofline | vs diffusers eager | rel. error | peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in result["results"]:
        eager = _find(entry["runs"], impl="diffusers", mode="eager")
        work = (
            f"{entry['flops']['total'] / 1e12:.2f} | {fmt(entry['roofline_ms'])}"
            if "flops" in entry
            else "- | -"
        )
        for run in entry["runs"]:
            lines.append(
                f"| {entry['workload']} | {entry['num_tokens']} | {work} | {run_label(run)} | "
                f"{fmt(run.get('median_ms'))} | {fmt(run.get('tflops'), 0)} | {fmt(run.get('roofline_fraction'))} | "
                f"{_ratio(eager and eager.get('median_ms'), run.get('median_ms'))} | {_sci(run.get('rel_error'))} | "
                f"{fmt(run.get('peak_memory_gib'), 1)} |"
            )
    return "\n".join(lines)


def diffusers_table(result: dict[str, Any]) -> str:
    lines = [
        "| workload | mode | first call s | p50 s | sequential per min | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for run in result["results"]:
        lines.append(
            f"| {run['workload']} | {run['mode']} | {fmt(run.get('first_call_s'), 1)} | "
            f"{fmt(run.get('latency_p50_s'))} | {fmt(run.get('sequential_per_minute'))} | "
            f"{fmt(run.get('peak_memory_gib'), 1)} |"
        )
    return "\n".join(lines)


def result_markdown(result: dict[str, Any]) -> str:
    from mstar.bench.llm import llm_table
    from mstar.bench.parity import parity_table
    from mstar.bench.suite_report import suite_table

    tables = {
        "llm": llm_table,
        "serve": serve_table,
        "step": step_table,
        "diffusers": diffusers_table,
        "serve-suite": suite_table,
        "parity": parity_table,
    }
    table = tables[result["benchmark"]](result)
    notes = "".join(f"\n- {note}" for note in result.get("notes", []))
    return f"### {result['benchmark']}: {result.get('title', '')}\n\n{table}\n{notes}\n".rstrip() + "\n"


def run_label(run: dict[str, Any]) -> str:
    if run["impl"] == "diffusers":
        return f"diffusers {run['mode']}"
    return f"mstar {run['mode']} / {run.get('attention_backend', '-')}"


def _find(runs: list[dict], **match: Any) -> dict | None:
    for run in runs:
        if all(run.get(k) == v for k, v in match.items()):
            return run
    return None


def comparison_rows(results: list[dict[str, Any]]) -> list[str]:
    """Rows of the docs table from any mix of step, diffusers and serve results (joined by workload)."""
    rows: list[str] = []
    for result in (r for r in results if r["benchmark"] == "step"):
        for entry in result["results"]:
            rows.extend(_step_rows(entry))
    pipelines = [run for r in results if r["benchmark"] == "diffusers" for run in r["results"]]
    serves = [r for r in results if r["benchmark"] == "serve"]
    for workload in sorted({run["workload"] for run in pipelines} | {_serve_workload(r) for r in serves}):
        rows.extend(_end_to_end_rows(workload, pipelines, serves))
    return rows + suite_rows(results, pipelines)


def suite_rows(results: list[dict[str, Any]], pipelines: list[dict]) -> list[str]:
    from mstar.bench.suite_report import suite_comparison_rows

    rows = []
    for result in (r for r in results if r["benchmark"] == "serve-suite"):
        rows.extend(suite_comparison_rows(result, pipelines))
    return rows


def _step_rows(entry: dict[str, Any]) -> list[str]:
    eager = _find(entry["runs"], impl="diffusers", mode="eager")
    compiled = _find(entry["runs"], impl="diffusers", mode="compiled")
    eager_ms = eager and eager.get("median_ms")
    compiled_ms = compiled and compiled.get("median_ms")
    rows = []
    for run in (r for r in entry["runs"] if r["impl"] == "mstar"):
        label = f"{entry['workload']} DiT step ({run['mode']}, {run.get('attention_backend')})"
        rows.append(
            f"| {label} | ms | {fmt(run.get('median_ms'))} | {fmt(eager_ms)} | {fmt(compiled_ms)} | "
            f"{_ratio(eager_ms, run.get('median_ms'))} | {fmt(run.get('roofline_fraction'))} |"
        )
    if not rows and eager_ms:
        rows.append(
            f"| {entry['workload']} DiT step | ms | - | {fmt(eager_ms)} | {fmt(compiled_ms)} | - | "
            f"{fmt(eager.get('roofline_fraction'))} (diffusers) |"
        )
    return rows


def _serve_workload(result: dict[str, Any]) -> str:
    return result.get("workload") or result["options"].get("model") or "serve"


def _end_to_end_rows(workload: str, pipelines: list[dict], serves: list[dict]) -> list[str]:
    eager = _find(pipelines, workload=workload, mode="eager") or {}
    compiled = _find(pipelines, workload=workload, mode="compiled") or {}
    serve_runs = [run for r in serves if _serve_workload(r) == workload for run in r["runs"]]
    single = _find(serve_runs, mode="closed", concurrency=1) or {}
    ours_p50 = single.get("latency_p50_s")
    rows = [
        f"| {workload} end to end, c=1 | p50 s | {fmt(ours_p50)} | {fmt(eager.get('latency_p50_s'))} | "
        f"{fmt(compiled.get('latency_p50_s'))} | {_ratio(eager.get('latency_p50_s'), ours_p50)} | - |"
    ]
    for run in (r for r in serve_runs if r["mode"] == "closed" and r["concurrency"] != 1):
        per_minute = run.get("images_per_minute", run.get("videos_per_minute"))
        base = eager.get("sequential_per_minute")
        rows.append(
            f"| {workload} throughput, c={run['concurrency']} (diffusers: sequential) | per min | "
            f"{fmt(per_minute)} | {fmt(base)} | {fmt(compiled.get('sequential_per_minute'))} | "
            f"{_ratio(per_minute, base)} | - |"
        )
    return rows


def code_label(env: dict[str, Any]) -> str:
    """Which code ran: the commit whose files equal the run's working tree when this repository has
    one (a copied tree's own git metadata may be stale), else what the run's git described."""
    from mstar.bench.env import commit_of_tree

    tree = env.get("tree")
    commit = commit_of_tree(tree) if tree else None
    if commit is not None:
        return f"commit {commit} (its files)"
    described = f"commit {env.get('commit') or '-'}"
    return f"{described}, tree {tree[:12]} (no commit here has those files)" if tree else described


def _env_lines(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for result in results:
        env = result.get("env", {})
        versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)
        lines.append(
            f"- {result['benchmark']}: {env.get('date_utc', '-')}, GPU {env.get('gpu') or '-'}, "
            f"CUDA {env.get('cuda') or '-'}, {versions}, {code_label(env)}"
        )
    return lines


def run_section(results: list[dict[str, Any]], commands: list[str], title: str | None = None) -> str:
    dates = sorted(r.get("env", {}).get("date_utc", "") for r in results)
    gpus = {r.get("env", {}).get("gpu") for r in results} - {None}
    heading = title or f"{dates[-1] if dates else 'undated'} on {', '.join(sorted(gpus)) or 'unknown GPU'}"
    body = [f"## {heading}", "", COMPARISON_HEADER, *comparison_rows(results), ""]
    from mstar.bench.suite_report import H200_MD_MARK, H200_MD_NOTE

    if any(H200_MD_MARK in row for row in body):  # a figure taken from H200.md, not this run
        body += [H200_MD_NOTE, ""]
    body += ["Measured with:"]
    body += _env_lines(results)
    body += ["", "Commands:", "```", *commands, "```", ""]
    details = [result_markdown(r) for r in results]
    return (
        "\n".join(body)
        + "\n<details><summary>all figures</summary>\n\n"
        + "\n".join(details)
        + "\n</details>\n"
    )


def update_benchmarks_doc(doc_path: Path, section: str) -> None:
    """Put `section` first under the marker; older sections stay below, untouched."""
    text = doc_path.read_text() if doc_path.exists() else ""
    if RUNS_MARKER not in text:
        # First structured write: the old header (and its empty table) are replaced by the new one.
        text = f"{DOC_HEADER}\n{RUNS_MARKER}\n"
    head, tail = text.split(RUNS_MARKER, 1)
    tail = tail.replace(NO_RUNS_YET, "")
    doc_path.write_text(f"{head}{RUNS_MARKER}\n\n{section}\n{tail.lstrip(chr(10))}".rstrip("\n") + "\n")


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    """Every *.json result under the given files or folders, in name order."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.rglob("*.json")) if path.is_dir() else [path])
    results = [json.loads(f.read_text()) for f in files]
    return [
        r
        for r in results
        if isinstance(r, dict) and r.get("benchmark") in ("serve", "step", "diffusers", "serve-suite")
    ]


def compact_table(results: list[dict[str, Any]]) -> str:
    from mstar.bench.suite_report import compact_table as tables

    return tables(results)
