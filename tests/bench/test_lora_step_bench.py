"""The LoRA step benchmark runs end to end on each family's tiny config (CPU): adapters load
through the store and the pack runs with and without them."""

import pytest

from mstar.bench.lora_step import FAMILIES, bench_family


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_lora_step_bench_prints_both_timings_and_the_load(family, capsys):
    bench_family(family, tiny=True, device="cpu", repeats=1)
    out = capsys.readouterr().out
    assert f"{family}: load a rank-32 adapter" in out
    assert "ms without LoRA" in out and "different rank-32 adapters" in out


def test_tiny_lora_step_bench_times_each_path_asked_on_the_same_dit(capsys):
    bench_family("z-image", tiny=True, device="cpu", repeats=1, paths=("grouped", "epilogue", "activation"))
    out = capsys.readouterr().out
    assert "(grouped path)" in out and "(epilogue path)" in out and "(activation path)" in out


def test_profile_names_the_kernels_the_adapters_add(monkeypatch, capsys):
    import mstar.bench.profile as profile
    from mstar.bench.lora_step import print_profile

    def base():
        return None

    def lora():
        return None

    def events(fn, num_steps, device):  # per call of fn: one GEMM; with LoRA two shrink launches more
        per_step = [("nvjet_gemm", 100.0)] + ([("triton_lora_shrink", 50.0)] * 2 if fn is lora else [])
        return per_step * num_steps

    monkeypatch.setattr(profile, "kernel_events", events)
    print_profile("wan2.2", lora, base, "cpu")
    lines = capsys.readouterr().out.splitlines()
    assert "kernel ms a step without -> with LoRA: 0.1 -> 0.2" in lines[0]
    assert "gemm 0.1 -> 0.1" in lines[0] and "triton 0.0 -> 0.1" in lines[0]
    assert lines[2].strip() == "+0.10 ms (0 -> 2 launches): triton_lora_shrink"
    assert lines[3].strip().startswith("+0.00 ms (1 -> 1 launches): nvjet_gemm")
