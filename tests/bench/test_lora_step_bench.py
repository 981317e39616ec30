"""The LoRA step benchmark runs end to end on the tiny Wan config (CPU): adapters load through the
store and the pack runs with and without them."""

from mstar.bench.lora_step import bench_wan


def test_tiny_lora_step_bench_prints_both_timings_and_the_load(capsys):
    bench_wan(tiny=True, device="cpu", repeats=1)
    out = capsys.readouterr().out
    assert "load a rank-32 adapter" in out
    assert "ms without LoRA" in out and "different rank-32 adapters" in out
