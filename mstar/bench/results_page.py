"""docs/benchmarks.md's tables from the phases' JSON: one table per model, mstar against diffusers
eager and compiled, every figure from the result files given (nothing carried over from elsewhere).

`mstar bench report RESULTS...` replaces what lies between the page's two markers with
`results_section(results)`; the method text around them is the page's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BEGIN_MARKER = "<!-- results: begin (written by `mstar bench report`) -->"
END_MARKER = "<!-- results: end -->"


@dataclass(frozen=True)
class ModelRows:
    name: str  # the served model's name (`mstar bench parity`'s model)
    title: str
    serve: str  # the serve-suite's workload name
    pipeline: str  # `mstar bench diffusers` workload
    steps: dict[str, str] = field(default_factory=dict)  # `mstar bench step` workload -> row label


MODELS = (
    ModelRows(
        "wan2.2-ti2v-5b",
        "Wan2.2-TI2V-5B, text to video: 832x480, 33 frames, 50 steps, guidance 5",
        serve="wan-480p-t2v",
        pipeline="wan-480p-t2v",
        steps={"wan-480p-cfg": "832x480x33 (guidance pair)", "wan-720p-b1": "1280x704x121"},
    ),
    ModelRows(
        "z-image-turbo",
        "Z-Image-Turbo, text to image: 1024x1024, 9 steps",
        serve="zimage-1024",
        pipeline="zimage-1024",
        steps={"zimage-1024-b1": "1024x1024"},
    ),
)


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "identical"
    return f"{value:,.{digits}f}{unit}"


def _first(items: list[dict], **match: Any) -> dict:
    return next((item for item in items if all(item.get(k) == v for k, v in match.items())), {})


def _step_entries(results: list[dict], workload: str) -> dict:
    entries = [e for r in results if r.get("benchmark") == "step" for e in r["results"]]
    return _first(entries, workload=workload)


def _pipeline(results: list[dict], workload: str, mode: str) -> dict:
    runs = [run for r in results if r.get("benchmark") == "diffusers" for run in r["results"]]
    return _first(runs, workload=workload, mode=mode)


def _suite(results: list[dict], workload: str) -> dict:
    return _first([r for r in results if r.get("benchmark") == "serve-suite"], workload=workload)


def _ours_step(entry: dict) -> dict:
    ours = [run for run in entry.get("runs", []) if run.get("impl") == "mstar"]
    return _first(ours, mode="deterministic") or (ours[0] if ours else {})


def _first_over_steady(first_s: float | None, steady_s: float | None) -> str:
    if first_s is None or not steady_s:
        return "-"
    return f"{first_s / steady_s:.2f}x ({first_s:.2f} s / {steady_s:.2f} s)"


def _parity(results: list[dict], name: str) -> dict:
    runs = [r for r in results if r.get("benchmark") == "parity"]
    return next(
        (r for r in runs if (r.get("options") or {}).get("model") == name and not r["options"].get("tiny")),
        {},
    )


def _parity_rows(results: list[dict], name: str) -> list[tuple[str, str, str, str]]:
    """Frames against the pipeline's on one folder (before any encoding), beside the pipeline
    against itself with other attention kernels."""
    rows = []
    for row in _parity(results, name).get("rows", []):
        if row.get("quantity") == "frames":
            rows.append((f"frames PSNR against diffusers', {row['case']}", _fmt(row.get("ours"), 1, " dB"),
                         f"{_fmt(row.get('yardstick'), 1, ' dB')} against itself ({row.get('yardstick_how', '-')})", "-"))  # fmt: skip
    return rows


def model_rows(model: ModelRows, results: list[dict]) -> list[tuple[str, str, str, str]]:
    """(metric, mstar, diffusers eager, diffusers compiled) of one model."""
    rows = []
    for workload, label in model.steps.items():
        entry = _step_entries(results, workload)
        runs = entry.get("runs", [])
        ours = _ours_step(entry)
        eager, compiled = (_first(runs, impl="diffusers", mode=m) for m in ("eager", "compiled"))
        rows.append(
            (f"DiT ms a step, {label}", _fmt(ours.get("median_ms"), 1), _fmt(eager.get("median_ms"), 1),
             _fmt(compiled.get("median_ms"), 1))
        )  # fmt: skip
        if ours.get("rel_error") is not None:
            parity = f"{_fmt(ours.get('psnr_db'), 1, ' dB')}, rel. error {ours['rel_error']:.1e}"
            rows.append((f"DiT output against diffusers', {label}", parity, "reference", "-"))
    rows += _parity_rows(results, model.name)
    suite = _suite(results, model.serve)
    summary = suite.get("summary", {})
    high = (suite.get("options") or {}).get("high_concurrency")
    eager, compiled = (_pipeline(results, model.pipeline, mode) for mode in ("eager", "compiled"))
    rows.append(
        ("c=1 p50 s", _fmt(summary.get("steady_p50_s")), _fmt(eager.get("latency_p50_s")),
         _fmt(compiled.get("latency_p50_s")))
    )  # fmt: skip
    rows.append(
        (f"per minute at c={high or 'N'} (diffusers: one at a time)", _fmt(summary.get(f"per_minute_c{high}")),
         _fmt(eager.get("sequential_per_minute")), _fmt(compiled.get("sequential_per_minute")))
    )  # fmt: skip
    rows.append(
        ("peak GiB allocated at c=1", _fmt(summary.get("peak_gpu_allocated_c1_gib"), 1),
         _fmt(eager.get("peak_memory_gib"), 1), _fmt(compiled.get("peak_memory_gib"), 1))
    )  # fmt: skip
    rows.append(
        ("first request at a new size / steady",
         _first_over_steady(summary.get("new_size_first_s"), summary.get("new_size_steady_p50_s")),
         _first_over_steady(eager.get("first_call_s"), eager.get("latency_p50_s")),
         _first_over_steady(compiled.get("first_call_s"), compiled.get("latency_p50_s")))
    )  # fmt: skip
    recompiles = summary.get("recompiles_in_traffic")
    rows.append(("recompiles in traffic", "-" if recompiles is None else str(recompiles), "-", "-"))
    return rows


def _env_line(result: dict) -> str:
    from mstar.bench.report import code_label

    env = result.get("env", {})
    versions = ", ".join(f"{name} {version}" for name, version in env.get("versions", {}).items() if version)
    return (
        f"- `{env.get('command') or result['benchmark']}`: {env.get('date_utc', '-')}, "
        f"{env.get('gpu') or '-'}, {versions}, {code_label(env)}"
    )


def _used(model: ModelRows, results: list[dict]) -> list[dict]:
    def uses(result: dict) -> bool:
        name = result.get("benchmark")
        if name == "step":
            return any(e.get("workload") in model.steps for e in result["results"])
        if name == "diffusers":
            return any(run.get("workload") == model.pipeline for run in result["results"])
        if name == "parity":
            return result is _parity(results, model.name)
        return name == "serve-suite" and result.get("workload") == model.serve

    return [result for result in results if uses(result)]


def results_section(results: list[dict]) -> str:
    parts = []
    for model in MODELS:
        used = _used(model, results)
        if not used:
            continue
        lines = [
            f"## {model.title}",
            "",
            "| | mstar | diffusers eager | diffusers compiled |",
            "|---|---|---|---|",
        ]
        lines += [f"| {' | '.join(row)} |" for row in model_rows(model, results)]
        lines += ["", "Measured with:", *(_env_line(r) for r in used), ""]
        parts.append("\n".join(lines))
    return "\n".join(parts) if parts else "_No results given._\n"


def update_results_page(doc_path: Path, results: list[dict]) -> None:
    """Replace the page's results (between the markers) with the tables of `results`."""
    text = doc_path.read_text() if doc_path.exists() else f"# Benchmarks\n\n{BEGIN_MARKER}\n{END_MARKER}\n"
    if BEGIN_MARKER not in text or END_MARKER not in text:
        raise ValueError(f"{doc_path}: no results markers ({BEGIN_MARKER} ... {END_MARKER})")
    head, rest = text.split(BEGIN_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    doc_path.write_text(f"{head}{BEGIN_MARKER}\n\n{results_section(results)}\n{END_MARKER}{tail}")
