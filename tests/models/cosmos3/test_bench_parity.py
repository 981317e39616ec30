"""`mstar bench parity cosmos3-edge | cosmos3-nano`: the family's hook end to end on the tiny configs
of both backbones on the CPU (the GPU run at full size is the same code): the pipeline written with
random weights, loaded back, and our nodes built from the same folder; the generation rows held to
their limit, and a row over its limit fails the run."""

import json

import pytest

from mstar.bench.cli import main
from mstar.bench.parity import limits_exceeded, parity_row, parity_table
from mstar.bench.parity_families import parity_family
from mstar.models.cosmos3.config import EDGE_TRANSFORMER, NANO_TRANSFORMER


def test_the_hook_knows_its_variants_and_backbones():
    assert parity_family("cosmos3-edge", tiny=True).variant == "t2v"
    assert parity_family("cosmos3-edge", "t2i", tiny=True).request["num_frames"] == 1
    assert parity_family("cosmos3-edge", "i2v", tiny=True).input_image.shape == (32, 32, 3)
    with pytest.raises(ValueError, match="variant"):
        parity_family("cosmos3-edge", "t2s", tiny=True)
    edge, nano = parity_family("cosmos3-edge"), parity_family("cosmos3-nano")
    assert (edge.model, nano.model) == ("cosmos3-edge", "cosmos3-nano")
    assert edge.spec.config.transformer == EDGE_TRANSFORMER
    assert nano.spec.config.transformer == NANO_TRANSFORMER  # 36 layers of 4096, 32/8 heads of 128
    assert nano.spec.config.pipeline.default_use_system_prompt  # diffusers' default flags
    assert [c.num_inference_steps for c in edge.cases] == [1, 20]  # Edge's recipe
    assert [c.num_inference_steps for c in nano.cases] == [1, 2]  # fits one call beside Edge's
    tiny_nano = parity_family("cosmos3-nano", tiny=True).spec.config.transformer
    assert (tiny_nano.hidden_act, tiny_nano.qk_norm_for_text) == ("silu", True)


def _rows(output) -> dict:
    return {(row["quantity"], row["case"]): row for row in json.loads(output.read_text())["rows"]}


def test_parity_runs_end_to_end_on_the_tiny_config(tmp_path, capsys):
    pytest.importorskip("diffusers")
    output = tmp_path / "parity.json"
    argv = ["parity", "cosmos3-edge", "--tiny", "--device", "cpu", "--variant", "t2v,t2i,i2v"]
    assert main([*argv, "--folder", str(tmp_path / "reference"), "-o", str(output)]) == 0
    rows = _rows(output)
    assert rows[("prompt token ids", "-")]["ours"] == 0 and rows[("prompt token ids", "-")]["num_tokens"] > 20
    assert rows[("negative prompt token ids ('')", "-")]["ours"] == 0
    for variant in ("t2v", "t2i", "i2v"):
        for case in ("1 step", "3 steps"):  # without guidance, then the recipe's 6.0
            label = f"{variant} {case}"
            assert rows[("latents", label)]["ours"] <= 1e-4
            assert rows[("latents", label)]["yardstick"] is not None
            assert rows[("frames", label)]["ours"] >= 40.0
    assert "| latents | i2v 3 steps | rel err |" in capsys.readouterr().out


def test_nano_parity_checks_the_generation_pathway_of_both_labels(tmp_path, capsys):
    pytest.importorskip("diffusers")
    output = tmp_path / "parity.json"
    argv = ["parity", "cosmos3-nano", "--tiny", "--device", "cpu", "--steps", "2"]
    assert main([*argv, "--folder", str(tmp_path / "reference"), "-o", str(output)]) == 0
    rows = _rows(output)
    for label in ("cond", "uncond"):
        for case in ("t=999", "t=500, first frame clean"):
            row = rows[(f"generation pathway output ({label})", case)]
            assert row["ours"] <= 1e-4 and row["limit"] == 2e-2 and row["yardstick"] is not None
    assert rows[("latents", "2 steps")]["ours"] <= 1e-4
    assert rows[("prompt token ids", "-")]["ours"] == 0  # with Nano's system prompt
    assert json.loads(output.read_text())["limits_exceeded"] == []
    assert "Within limits: 4 rows (0.02)." in capsys.readouterr().out


def test_a_row_over_its_limit_fails_the_run(tmp_path, monkeypatch):
    from mstar.bench import parity

    rows = [
        parity_row("generation pathway output (cond)", "t=999", "rel err", 3e-2, 1e-3, "-", limit=2e-2),
        parity_row("generation pathway output (uncond)", "t=999", "rel err", 1e-3, 1e-3, "-", limit=2e-2),
        parity_row(
            "generation pathway output (cond)", "t=500", "rel err", float("nan"), None, "-", limit=2e-2
        ),
        parity_row("latents", "1 step", "rel err", 0.5, None, "-"),  # no limit: reported, not checked
    ]
    exceeded = limits_exceeded(rows)
    assert exceeded == [
        "generation pathway output (cond), t=999: 3.00e-02 > 0.02",
        "generation pathway output (cond), t=500: nan > 0.02",
    ]
    table = parity_table({"rows": rows, "limits_exceeded": exceeded})
    assert "LIMITS EXCEEDED (2 of 3 rows)" in table
    result = {"benchmark": "parity", "title": "t", "rows": rows, "limits_exceeded": exceeded}
    monkeypatch.setattr(parity, "run_parity", lambda options: result)
    assert main(["parity", "cosmos3-edge", "-o", str(tmp_path / "p.json")]) == 1
    monkeypatch.setattr(parity, "run_parity", lambda options: result | {"limits_exceeded": []})
    assert main(["parity", "cosmos3-edge", "-o", str(tmp_path / "p.json")]) == 0
