"""The profile tool: kernels grouped by kind per step, and a CPU dry run end to end."""

import json

import pytest

from mstar.bench.profile import kernel_kind, main, summarize_kernels


def test_kernels_are_grouped_by_kind_per_step():
    events = [
        ("nvjet_sm90_tst_192x176_64x4_1x2_h_bz_coopB_bias_TNT", 400.0),
        ("void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90", 300.0),
        ("triton_red_fused__to_copy_add_native_layer_norm_5", 100.0),
        ("Memset (Device)", 1.0),
    ] * 2
    summary = summarize_kernels(events, num_steps=2)
    assert summary["kernel_ms_per_step"] == pytest.approx(0.801)
    assert summary["by_kind_ms"] == pytest.approx(
        {"attention": 0.3, "gemm": 0.4, "other": 0.001, "triton": 0.1}
    )
    assert summary["top_kernels"][0]["kind"] == "gemm" and summary["top_kernels"][0]["launches_per_step"] == 1
    assert kernel_kind("void at::native::CatArrayBatchedCopy<float>") == "copy"


def test_cpu_dry_run_writes_timings_for_each_workload(tmp_path):
    output = tmp_path / "profile.json"
    argv = ["--device", "cpu", "--workloads", "tiny-wan-cfg,tiny-zimage-c2", "--compile-modes", "off"]
    argv += ["--attention-backend", "torch", "--num-timed", "1", "--num-profiled", "1", "-o", str(output)]
    assert main(argv) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [run["workload"] for run in runs] == ["tiny-wan-cfg", "tiny-zimage-c2"]
    assert all(run["median_ms"] > 0 and "error" not in run for run in runs)
    assert output.with_suffix(".md").read_text().count("###") == 2
