"""Report format: tables from result JSON, and docs/benchmarks.md sections newest first."""

from __future__ import annotations

import json

from mstar.bench.cli import main
from mstar.bench.report import COMPARISON_HEADER, RUNS_MARKER, comparison_rows, result_markdown

ENV = {
    "date_utc": "2026-11-29 08:00 UTC",
    "gpu": "NVIDIA H200",
    "cuda": "13.0",
    "versions": {"torch": "2.11.0", "diffusers": "0.42.1"},
    "commit": "abc1234",
    "command": "mstar bench step",
}


def step_result() -> dict:
    runs = [
        {"impl": "diffusers", "mode": "eager", "median_ms": 175.0, "roofline_fraction": 0.5},
        {"impl": "diffusers", "mode": "compiled", "median_ms": 130.0, "roofline_fraction": 0.7},
        {
            "impl": "mstar",
            "mode": "deterministic",
            "attention_backend": "fa3",
            "median_ms": 100.0,
            "tflops": 500.0,
            "roofline_fraction": 0.9,
            "rel_error": 0.0123,
        },
    ]
    entry = {
        "workload": "wan-480p-cfg",
        "num_tokens": 7020,
        "flops": {"gemm": 60e12, "attention": 12e12, "total": 72e12},
        "roofline_ms": 95.1,
        "runs": runs,
    }
    return {
        "benchmark": "step",
        "title": "DiT ms per step",
        "results": [entry],
        "notes": ["a note"],
        "env": ENV,
    }


def pipeline_result() -> dict:
    results = [
        {"workload": "wan-480p-t2v", "mode": "eager", "latency_p50_s": 12.0, "sequential_per_minute": 5.0},
        {"workload": "wan-480p-t2v", "mode": "compiled", "latency_p50_s": 10.0, "first_call_s": 120.0},
    ]
    return {"benchmark": "diffusers", "results": results, "env": ENV | {"command": "mstar bench diffusers"}}


def serve_result() -> dict:
    def run(concurrency: int, p50: float, per_minute: float) -> dict:
        return {
            "mode": "closed",
            "concurrency": concurrency,
            "request_rate": None,
            "num_requests": 8,
            "num_completed": 8,
            "errors": {"http_429": 1} if concurrency == 4 else {},
            "latency_p50_s": p50,
            "latency_p95_s": p50 + 1,
            "latency_p99_s": p50 + 2,
            "first_progress_p50_s": 0.4,
            "videos_per_minute": per_minute,
            "peak_gpu_memory_gib": 30.0,
        }

    return {
        "benchmark": "serve",
        "workload": "wan-480p-t2v",
        "options": {"kind": "video", "model": "wan2.2-ti2v-5b"},
        "runs": [{"mode": "warmup"}, run(1, 8.0, 7.5), run(4, 12.0, 20.0)],
        "env": ENV | {"command": "mstar bench serve --workload wan-480p-t2v"},
    }


def test_step_table_reads_as_ratio_and_roofline():
    markdown = result_markdown(step_result())
    assert (
        "| wan-480p-cfg | 7020 | 72.00 | 95.10 | mstar deterministic / fa3 | 100.00 | 500 | 0.90 | 1.75x | 1.2e-02 | - |"
        in markdown
    )
    assert "| wan-480p-cfg | 7020 | 72.00 | 95.10 | diffusers eager | 175.00 |" in markdown
    assert "- a note" in markdown


def test_comparison_rows_join_step_pipeline_and_serve_by_workload():
    rows = comparison_rows([step_result(), pipeline_result(), serve_result()])
    assert rows[0] == (
        "| wan-480p-cfg DiT step (deterministic, fa3) | ms | 100.00 | 175.00 | 130.00 | 1.75x | 0.90 |"
    )
    assert rows[1] == "| wan-480p-t2v end to end, c=1 | p50 s | 8.00 | 12.00 | 10.00 | 1.50x | - |"
    assert rows[2].startswith(
        "| wan-480p-t2v throughput, c=4 (diffusers: sequential) | per min | 20.00 | 5.00 |"
    )
    assert "4.00x" in rows[2]


def test_serve_table_has_errors_and_memory():
    markdown = result_markdown(serve_result())
    assert "| closed | c=4 | 8 / 8 | 12.00 | 13.00 | 14.00 | 0.40 | 20.00 | http_429: 1 | 30.0 |" in markdown
    assert "warmup" not in markdown


def test_report_command_keeps_history_newest_first(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nold header text\n\n| a | b |\n|---|---|\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "step.json").write_text(json.dumps(step_result()))
    (results / "not-a-result.json").write_text(json.dumps({"hello": 1}))
    assert main(["report", str(results), "--doc", str(doc), "--title", "first run"]) == 0
    (results / "serve.json").write_text(json.dumps(serve_result()))
    assert (
        main(["report", str(results), "--doc", str(doc), "--title", "second run", "--command", "bash x.sh"])
        == 0
    )
    text = doc.read_text()
    assert text.count(RUNS_MARKER) == 1 and text.count(COMPARISON_HEADER) == 2
    assert text.index("## second run") < text.index("## first run")
    assert "bash x.sh" in text and "mstar bench step" in text
    assert "GPU NVIDIA H200, CUDA 13.0, torch 2.11.0, diffusers 0.42.1, commit abc1234" in text
    assert "old header text" not in text


def test_report_without_results_fails(tmp_path):
    assert main(["report", str(tmp_path), "--doc", str(tmp_path / "doc.md")]) == 1
