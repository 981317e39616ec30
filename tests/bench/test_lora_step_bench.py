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
