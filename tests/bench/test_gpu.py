"""GPU paths of the benchmarks (CUDA events, compile, NVML, peak memory) at tiny sizes; the lead runs
these on the H200 (`pytest -m gpu tests/bench`). They skip cleanly without CUDA or diffusers."""

from __future__ import annotations

import json

import pytest

from mstar.bench.cli import main
from mstar.bench.gpu_memory import PeakMemoryPoller

pytestmark = pytest.mark.gpu


def test_gpu_memory_poller_sees_the_device():
    with PeakMemoryPoller(interval_s=0.05) as memory:
        pass
    assert memory.source in ("nvml", "nvidia-smi")
    assert memory.peak_gib is not None and memory.peak_gib >= 0


def test_step_on_cuda_compiled_and_eager_agree_with_diffusers(tmp_path):
    pytest.importorskip("diffusers")
    output = tmp_path / "step.json"
    argv = ["step", "--tiny", "--workloads", "tiny-wan-cfg,tiny-zimage-c2", "--device", "cuda"]
    argv += ["--compile-modes", "off,deterministic", "--attention-backends", "auto"]
    argv += [
        "--diffusers-modes",
        "eager,compiled",
        "--num-warmup",
        "2",
        "--num-timed",
        "3",
        "-o",
        str(output),
    ]
    assert main(argv) == 0
    result = json.loads(output.read_text())
    assert result["env"]["gpu"]
    for entry in result["results"]:
        labels = {(r["impl"], r["mode"]) for r in entry["runs"]}
        assert {
            ("diffusers", "eager"),
            ("diffusers", "compiled"),
            ("mstar", "off"),
            ("mstar", "deterministic"),
        } <= labels, result["notes"]
        for run in entry["runs"]:
            assert len(run["times_ms"]) == 3 and run["median_ms"] > 0
            assert run["peak_memory_gib"] > 0
            if run["impl"] == "mstar":
                assert run["rel_error"] < 3e-2  # bf16, same weights and inputs


def test_diffusers_pipeline_on_cuda_reports_peak_memory(tmp_path):
    pytest.importorskip("diffusers")
    output = tmp_path / "diffusers.json"
    argv = [
        "diffusers",
        "--workloads",
        "tiny-zimage",
        "--modes",
        "eager",
        "--num-timed",
        "2",
        "-o",
        str(output),
    ]
    assert main(argv) == 0
    (run,) = json.loads(output.read_text())["results"]
    assert run["peak_memory_gib"] > 0 and run["latency_p50_s"] > 0
