"""Markdown of `mstar bench serve-suite` results (our server's serving profile) and the compact
table that bench/h200.sh prints last."""

from __future__ import annotations

import math
from typing import Any

TARGETS = {
    "cold_over_steady": 1.10,
    "new_size_first_over_steady": 1.50,
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
        (
            "new size: first / steady p50 s",
            f"{_fmt(s.get('new_size_first_s'))} / {_fmt(s.get('new_size_steady_p50_s'))}",
            "",
        ),
        (
            "new size: first / steady",
            _fmt(s.get("new_size_first_over_steady")),
            f"<= {TARGETS['new_size_first_over_steady']:.2f}",
        ),
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
