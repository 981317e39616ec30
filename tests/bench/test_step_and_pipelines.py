"""`mstar bench step` and `mstar bench diffusers` end to end on CPU with tiny configs."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from mstar.bench.cli import main
from tests.bench.fake_server import FakeBehaviour, FakeServer

pytest.importorskip("diffusers")


def _ours_importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


@pytest.mark.parametrize("fuse", ["0", "1"], ids=["unfused", "fused"])
def test_step_times_both_and_checks_parity_with_the_same_weights(tmp_path, monkeypatch, fuse):
    monkeypatch.setenv("MSTAR_FUSE_PROJECTIONS", fuse)  # fused projections are CUDA-only by default
    output = tmp_path / "step.json"
    argv = [
        "step",
        "--tiny",
        "--workloads",
        "tiny-wan-cfg,tiny-zimage-c2",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    argv += [
        "--compile-modes",
        "off",
        "--attention-backends",
        "torch",
        "--num-warmup",
        "1",
        "--num-timed",
        "1",
    ]
    assert main([*argv, "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    assert output.with_suffix(".md").read_text().startswith("### step")
    assert result["env"]["versions"]["diffusers"]
    for entry in result["results"]:
        assert entry["flops"]["total"] == entry["flops"]["gemm"] + entry["flops"]["attention"] > 0
        diffusers_run = next(r for r in entry["runs"] if r["impl"] == "diffusers")
        assert diffusers_run["mode"] == "eager" and len(diffusers_run["times_ms"]) == 1
        assert diffusers_run["median_ms"] > 0 and 0 < diffusers_run["roofline_fraction"] < 1
        ours = [r for r in entry["runs"] if r["impl"] == "mstar"]
        assert len(ours) == 1, result["notes"]
        # same weights, same inputs, float32: ours matches diffusers' transformer
        assert ours[0]["rel_error"] < 1e-4


def test_step_without_ours_says_so(tmp_path):
    output = tmp_path / "step.json"
    argv = ["step", "--tiny", "--workloads", "tiny-zimage-c2", "--device", "cpu", "--dtype", "float32"]
    assert main([*argv, "--skip-ours", "--num-warmup", "1", "--num-timed", "1", "-o", str(output)]) == 0
    (entry,) = json.loads(output.read_text())["results"]
    assert [r["impl"] for r in entry["runs"]] == ["diffusers"]
    assert entry["num_items"] == 2 and entry["num_tokens"] == 2 * 32  # 16x16 -> 16 patches, padded to 32


def test_diffusers_pipelines_report_latency_and_throughput(tmp_path):
    pytest.importorskip("transformers")  # the pipelines' text encoders
    output = tmp_path / "diffusers.json"
    argv = ["diffusers", "--workloads", "tiny-zimage,tiny-wan-t2v", "--device", "cpu", "--modes", "eager"]
    assert main([*argv, "--num-warmup", "1", "--num-timed", "1", "--steps", "1", "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    assert [r["workload"] for r in result["results"]] == ["tiny-zimage", "tiny-wan-t2v"]
    for run in result["results"]:
        assert run["mode"] == "eager" and run["num_inference_steps"] == 1
        assert len(run["latencies_s"]) == 1 and run["first_call_s"] > 0
        assert run["sequential_per_minute"] == pytest.approx(60 / sum(run["latencies_s"]))


def test_serve_command_writes_json_and_markdown(tmp_path):
    output = tmp_path / "serve.json"
    with FakeServer(FakeBehaviour(image_delay_s=0.0)) as server:
        argv = ["serve", "--base-url", server.url, "--workload", "tiny-zimage", "--concurrency", "1,2"]
        assert main([*argv, "--num-requests", "3", "--num-warmup", "1", "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["workload"] == "tiny-zimage"
    assert result["options"]["kind"] == "image" and result["options"]["size"] == "64x64"
    assert result["options"]["num_inference_steps"] == 2
    assert [run["mode"] for run in result["runs"]] == ["warmup", "closed", "closed"]
    assert "| closed | c=2 | 3 / 3 |" in output.with_suffix(".md").read_text()


def test_step_without_diffusers_times_ours_alone(tmp_path, monkeypatch):
    if not _ours_importable("mstar.models.zimage.dit"):
        pytest.skip("our Z-Image DiT has not landed")
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as on the H200 server run: not importable
    output = tmp_path / "step.json"
    argv = ["step", "--tiny", "--workloads", "tiny-zimage-c2", "--device", "cpu", "--dtype", "float32"]
    argv += [
        "--compile-modes",
        "off",
        "--attention-backends",
        "torch",
        "--num-warmup",
        "1",
        "--num-timed",
        "1",
    ]
    assert main([*argv, "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    (entry,) = result["results"]
    (run,) = entry["runs"]
    assert run["impl"] == "mstar" and run["rel_error"] is None and run["median_ms"] > 0
    assert any("diffusers is not importable" in note for note in result["notes"])


def test_fuse_projections_switch(monkeypatch):
    from mstar.bench.ours import fuse_projections_enabled

    monkeypatch.delenv("MSTAR_FUSE_PROJECTIONS", raising=False)
    assert fuse_projections_enabled("cuda:0") and not fuse_projections_enabled("cpu")
    monkeypatch.setenv("MSTAR_FUSE_PROJECTIONS", "0")
    assert not fuse_projections_enabled("cuda")
    monkeypatch.setenv("MSTAR_FUSE_PROJECTIONS", "1")
    assert fuse_projections_enabled("cpu")
    monkeypatch.setenv("MSTAR_FUSE_PROJECTIONS", "yes")
    with pytest.raises(ValueError, match="MSTAR_FUSE_PROJECTIONS"):
        fuse_projections_enabled("cuda")


def test_triton_kernels_switch_follows_the_server_rule_unless_set(monkeypatch):
    from mstar.bench import ours
    from mstar.engine import kernels

    monkeypatch.delenv("MSTAR_TRITON_KERNELS", raising=False)
    assert not ours.triton_kernels_enabled("cpu")  # the server's rule: CUDA with Triton
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: object())
    assert ours.triton_kernels_enabled("cuda:0")
    monkeypatch.setenv("MSTAR_TRITON_KERNELS", "0")
    assert not ours.triton_kernels_enabled("cuda:0")
    monkeypatch.setenv("MSTAR_TRITON_KERNELS", "1")
    assert ours.triton_kernels_enabled("cpu")
    monkeypatch.setenv("MSTAR_TRITON_KERNELS", "on")
    with pytest.raises(ValueError, match="MSTAR_TRITON_KERNELS"):
        ours.triton_kernels_enabled("cuda")


def test_step_skip_diffusers_times_ours_alone_even_where_importable(tmp_path):
    if not _ours_importable("mstar.models.zimage.dit"):
        pytest.skip("our Z-Image DiT has not landed")
    pytest.importorskip("diffusers")
    output = tmp_path / "step.json"
    argv = ["step", "--tiny", "--workloads", "tiny-zimage-c2", "--device", "cpu", "--dtype", "float32"]
    argv += ["--compile-modes", "off", "--attention-backends", "torch", "--skip-diffusers"]
    assert main([*argv, "--num-warmup", "1", "--num-timed", "1", "-o", str(output)]) == 0
    (entry,) = json.loads(output.read_text())["results"]
    assert [(r["impl"], r["rel_error"]) for r in entry["runs"]] == [("mstar", None)]


def test_serve_suite_command_fills_the_workload_and_table_prints_it(tmp_path, capsys):
    output = tmp_path / "suite-wan.json"
    with FakeServer(FakeBehaviour(video_duration_s=0.1)) as server:
        argv = ["serve-suite", "--base-url", server.url, "--workload", "wan-480p-t2v", "--boot-s", "12.5"]
        argv += [
            "--sizes",
            "832x480,480x832",
            "--num-steady",
            "2",
            "--num-high",
            "2",
            "--high-concurrency",
            "2",
        ]
        assert main([*argv, "--num-mixed", "2", "--poll-interval", "0.02", "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    serve = result["options"]["serve"]
    assert (serve["kind"], serve["size"], serve["sizes"]) == ("video", "832x480", ["832x480", "480x832"])
    assert serve["num_inference_steps"] == 50 and serve["extra_body"]["num_frames"] == 33
    assert [r["size"] for r in result["phases"]["mixed"]["requests"]] == ["832x480", "480x832"]
    assert [r["size"] for r in result["phases"]["c2"]["requests"]] == ["832x480", "832x480"]
    assert (
        result["summary"]["boot_s"] == 12.5 and result["summary"]["recompiles_in_traffic"] is None
    )  # no /metrics
    assert main(["table", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "### serve-suite: wan-480p-t2v" in printed and "| c=2 / c=1 throughput |" in printed


@pytest.mark.parametrize(
    "name,dit_class,method",
    [("tiny-wan-cfg", "mstar.models.wan22.dit:WanDiT", "text_kv"),
     ("tiny-zimage-c2", "mstar.models.zimage.dit:ZImageDiT", "refine_caption")],
)  # fmt: skip
def test_step_keeps_text_only_work_across_steps_as_the_server_does(monkeypatch, name, dit_class, method):
    import importlib

    import torch

    from mstar.bench.baseline import step_workloads
    from mstar.bench.ours import build_ours

    entry, workload = step_workloads()[name]
    items = entry.example_items(workload, "cpu", torch.float32, seed=0)
    module_name, class_name = dit_class.split(":")
    dit_class = getattr(importlib.import_module(module_name), class_name)
    calls = []
    original = getattr(dit_class, method)
    monkeypatch.setattr(dit_class, method, lambda self, *args: calls.append(1) or original(self, *args))
    forward = build_ours(entry, entry.transformer_config(True), None, "cpu", torch.float32, "torch", "off")
    with torch.inference_mode():
        first = forward(items)
        again = forward(items)
    assert len(calls) == len({id(item["text"]) for item in items})  # once per text, at the first step
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.parametrize("workload", ["tiny-zimage", "tiny-wan-t2v"])
def test_baseline_pipeline_dit_runs_in_the_requested_dtype(workload):
    """The baseline DiT in bf16 (fp32 ran diffusers 7x slower on the H200), less diffusers' own
    _keep_in_fp32_modules, as from_pretrained(torch_dtype=bf16) loads it."""
    import torch

    from mstar.bench.pipelines import build_pipeline

    pipe = build_pipeline(workload, "cpu", seed=0, dit_dtype=torch.bfloat16)
    transformer = pipe.transformer
    keep = tuple(transformer._keep_in_fp32_modules or ())
    dtypes = {name: p.dtype for name, p in transformer.named_parameters()}
    assert {d for n, d in dtypes.items() if not any(k in n for k in keep)} == {torch.bfloat16}


def test_regional_mode_compiles_each_repeated_block_once_and_unknown_modes_fail(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import torch

    compiled: list[str] = []
    monkeypatch.setattr(
        torch.nn.Module, "compile", lambda self, *args, **kwargs: compiled.append(type(self).__name__)
    )
    output = tmp_path / "regional.json"
    argv = ["diffusers", "--workloads", "tiny-ltx2-t2v", "--device", "cpu", "--modes", "regional"]
    assert main([*argv, "--num-warmup", "1", "--num-timed", "1", "--steps", "1", "-o", str(output)]) == 0
    (run,) = json.loads(output.read_text())["results"]
    assert run["mode"] == "regional" and len(run["latencies_s"]) == 1
    assert compiled and set(compiled) == {"LTX2VideoTransformerBlock"}  # the blocks, not the whole model
    with pytest.raises(ValueError, match="unknown \\['bogus'\\]"):
        main(["diffusers", "--workloads", "tiny-ltx2-t2v", "--device", "cpu", "--modes", "eager,bogus"])
