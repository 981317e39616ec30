"""Report format: tables from result JSON, and docs/benchmarks.md's per-model tables from one run's."""

from __future__ import annotations

import json

from mstar.bench.cli import main
from mstar.bench.report import result_markdown
from mstar.bench.results_page import BEGIN_MARKER, END_MARKER, results_section

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
            "psnr_db": 46.25,
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


def suite_result() -> dict:
    summary = {
        "steady_p50_s": 8.0,
        "per_minute_c4": 20.0,
        "peak_gpu_allocated_c1_gib": 25.5,
        "new_size_first_s": 9.0,
        "new_size_steady_p50_s": 8.0,
        "recompiles_in_traffic": 0,
    }
    return {
        "benchmark": "serve-suite",
        "workload": "wan-480p-t2v",
        "options": {"serve": {"kind": "video"}, "high_concurrency": 4},
        "summary": summary,
        "env": ENV | {"command": "mstar bench serve-suite --workload wan-480p-t2v"},
    }


def test_one_table_per_model_from_the_runs_results_only():
    section = results_section([step_result(), pipeline_result(), suite_result()])
    rows = {line.split(" | ")[0].lstrip("| "): line for line in section.splitlines() if line.startswith("| ")}
    assert section.startswith("## Wan2.2-TI2V-5B") and "Z-Image" not in section  # no Z-Image results given
    assert rows["DiT ms a step, 832x480x33 (guidance pair)"].endswith("| 100.0 | 175.0 | 130.0 |")
    parity = rows["DiT output against diffusers', 832x480x33 (guidance pair)"]
    assert parity.endswith("| 46.2 dB, rel. error 1.2e-02 | reference | - |")
    assert rows["DiT ms a step, 1280x704x121"].endswith("| - | - | - |")  # not in these results
    assert rows["c=1 p50 s"].endswith("| 8.00 | 12.00 | 10.00 |")
    assert rows["per minute at c=4 (diffusers: one at a time)"].endswith("| 20.00 | 5.00 | - |")
    assert rows["first request at a new size / steady"].endswith(
        "| 1.12x (9.00 s / 8.00 s) | - | 12.00x (120.00 s / 10.00 s) |"
    )
    assert rows["recompiles in traffic"].endswith("| 0 | - | - |")
    assert (
        "- `mstar bench diffusers`: 2026-11-29 08:00 UTC, NVIDIA H200, torch 2.11.0, diffusers 0.42.1"
        in section
    )


def test_serve_table_has_errors_and_memory():
    markdown = result_markdown(serve_result())
    assert "| closed | c=4 | 8 / 8 | 12.00 | 13.00 | 14.00 | 0.40 | 20.00 | http_429: 1 | 30.0 |" in markdown
    assert "warmup" not in markdown


def test_report_command_rewrites_the_tables_between_the_markers_only(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nintro\n\n{BEGIN_MARKER}\nold tables\n{END_MARKER}\n\n## Method\ntext\n")
    results = tmp_path / "results"
    results.mkdir()
    (results / "step.json").write_text(json.dumps(step_result()))
    (results / "not-a-result.json").write_text(json.dumps({"hello": 1}))
    assert main(["report", str(results), "--doc", str(doc)]) == 0
    (results / "suite.json").write_text(json.dumps(suite_result()))
    assert main(["report", str(results), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert "old tables" not in text and text.count("## Wan2.2-TI2V-5B") == 1
    assert text.startswith("# Benchmarks\n\nintro\n") and text.endswith("## Method\ntext\n")
    assert "| c=1 p50 s | 8.00 |" in text and "mstar bench serve-suite" in text


def test_a_page_without_markers_is_left_alone(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nhand-written\n")
    (tmp_path / "step.json").write_text(json.dumps(step_result()))
    try:
        main(["report", str(tmp_path / "step.json"), "--doc", str(doc)])
    except ValueError as error:
        assert "markers" in str(error)
    assert doc.read_text() == "# Benchmarks\n\nhand-written\n"


def test_report_without_results_fails(tmp_path):
    assert main(["report", str(tmp_path), "--doc", str(tmp_path / "doc.md")]) == 1


def test_the_pipelines_frames_on_one_folder_join_the_models_table():
    rows = [
        {"quantity": "latents", "case": "50 steps", "metric": "rel err", "ours": 1e-3, "yardstick": 2e-3},
        {"quantity": "frames", "case": "50 steps", "metric": "PSNR dB", "ours": 41.53, "yardstick": 44.0,
         "yardstick_how": "reference, other SDPA kernels"},
    ]  # fmt: skip
    parity = {
        "benchmark": "parity",
        "options": {"model": "z-image-turbo", "tiny": False},
        "rows": rows,
        "env": ENV,
    }
    section = results_section([parity])
    assert section.startswith("## Z-Image-Turbo")
    assert (
        "| frames PSNR against diffusers', 50 steps | 41.5 dB | 44.0 dB against itself "
        "(reference, other SDPA kernels) | - |" in section
    )
    assert results_section([parity | {"options": {"model": "z-image-turbo", "tiny": True}}]).startswith("_No")
