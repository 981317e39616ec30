"""The diffusers LoRA baseline (one adapter at a time, fused) on tiny configs (CPU): a switch leaves
exactly the new adapter fused, and the benchmark prints and returns its four figures."""

import math

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from mstar.bench import lora_diffusers  # noqa: E402
from mstar.bench.baseline import diffusers_transformer, step_workloads  # noqa: E402


def _forward(entry, model, items):
    with torch.inference_mode():
        return entry.diffusers_forward(model, items)


def test_a_switch_leaves_only_the_new_adapter_fused(tmp_path):
    entry, workload = step_workloads()[lora_diffusers.WORKLOADS["wan2.2"][1]]
    paths = lora_diffusers.write_family_adapters("wan2.2", True, str(tmp_path))

    def model():
        return diffusers_transformer(entry, entry.transformer_config(True), "cpu", torch.float32, seed=0)

    items = entry.example_items(workload, "cpu", torch.float32, 0)
    switched = model()
    base = _forward(entry, switched, items)
    first = lora_diffusers._switch(switched, paths[0], None)
    lora_diffusers._switch(switched, paths[1], first)
    only_second = model()
    lora_diffusers._switch(only_second, paths[1], None)
    second = _forward(entry, only_second, items)
    for ours, theirs, plain in zip(_forward(entry, switched, items), second, base, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-5)
        assert not torch.allclose(ours, plain, atol=1e-3)  # the adapter is applied


def test_tiny_bench_prints_and_returns_the_four_figures(capsys):
    figures = lora_diffusers.bench_family("z-image", tiny=True, repeats=1)
    assert set(figures) == {"step_ms", "fused_step_ms", "switch_ms", "four_requests_ms"}
    assert all(math.isfinite(value) and value > 0 for value in figures.values())
    out = capsys.readouterr().out
    assert "one at a time" in out and "switching adapters" in out
