"""The profile tool: kernels grouped by kind per step, and a CPU dry run end to end."""

import json
import threading
import time

import pytest

from mstar.bench.profile import host_cpu_split, host_profile, kernel_kind, main, summarize_kernels


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
    argv += ["--num-host-profiled", "1"]
    assert main(argv) == 0
    runs = json.loads(output.read_text())["runs"]
    assert [run["workload"] for run in runs] == ["tiny-wan-cfg", "tiny-zimage-c2"]
    assert all(run["median_ms"] > 0 and "error" not in run for run in runs)
    assert all(run["host_functions"] and run["host_cpu"]["wall_ms"] > 0 for run in runs)
    assert output.with_suffix(".md").read_text().count("###") == 2


def _busy_leaf(num_rounds: int) -> int:
    return sum(i * i for i in range(num_rounds))


def test_host_profile_names_the_functions_that_take_the_host_time():
    def step():
        for _ in range(3):
            _busy_leaf(20_000)

    rows = host_profile(step, num_steps=2)
    leaf = next(row for row in rows if row["function"].endswith("(_busy_leaf)"))
    assert leaf["calls_per_step"] == 3
    assert leaf["cumulative_ms_per_step"] >= leaf["own_ms_per_step"] > 0
    assert rows == sorted(rows, key=lambda row: -row["own_ms_per_step"])


def test_host_cpu_split_tells_waiting_from_working():
    syncs = []

    def waits():
        time.sleep(0.02)

    def works():
        _busy_leaf(200_000)

    waiting = host_cpu_split(waits, num_steps=3, sync=lambda: syncs.append(1))
    working = host_cpu_split(works, num_steps=3)
    # CPU times, not wall-clock bounds: a busy machine stretches the working step's wall time
    assert waiting["wall_ms"] >= 20 and waiting["thread_cpu_ms"] < 0.25 * waiting["wall_ms"]
    assert working["thread_cpu_ms"] > 4 * waiting["thread_cpu_ms"]
    assert working["process_cpu_ms"] >= working["thread_cpu_ms"] * 0.9
    assert len(syncs) == 4  # before each step, and once after
    assert threading.current_thread().name in waiting["threads"]
