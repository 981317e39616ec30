"""Markdown from benchmark JSON: one table per result file (what each benchmark prints and
`mstar bench table` shows). docs/benchmarks.md's per-model tables are mstar/bench/results_page.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    """Every *.json result under the given files or folders, in name order."""
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.rglob("*.json")) if path.is_dir() else [path])
    results = [json.loads(f.read_text()) for f in files]
    return [
        r
        for r in results
        if isinstance(r, dict)
        and r.get("benchmark") in ("serve", "step", "diffusers", "serve-suite", "parity")
    ]


def compact_table(results: list[dict[str, Any]]) -> str:
    from mstar.bench.suite_report import compact_table as tables

    return tables(results)
