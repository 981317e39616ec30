"""`mstar bench parity cosmos3-edge`: the family's hook end to end on the tiny config on the CPU
(the GPU run at full size is the same code): the pipeline written with random weights, loaded back,
and our nodes built from the same folder."""

import json

import pytest

from mstar.bench.cli import main
from mstar.bench.parity_families import parity_family


def test_the_hook_knows_its_variants():
    assert parity_family("cosmos3-edge", tiny=True).variant == "t2v"
    assert parity_family("cosmos3-edge", "t2i", tiny=True).request["num_frames"] == 1
    assert parity_family("cosmos3-edge", "i2v", tiny=True).input_image.shape == (32, 32, 3)
    with pytest.raises(ValueError, match="variant"):
        parity_family("cosmos3-edge", "t2s", tiny=True)


def test_parity_runs_end_to_end_on_the_tiny_config(tmp_path, capsys):
    pytest.importorskip("diffusers")
    output = tmp_path / "parity.json"
    argv = ["parity", "cosmos3-edge", "--tiny", "--device", "cpu", "--variant", "t2v,t2i,i2v"]
    assert main([*argv, "--folder", str(tmp_path / "reference"), "-o", str(output)]) == 0
    rows = {(row["quantity"], row["case"]): row for row in json.loads(output.read_text())["rows"]}
    assert rows[("prompt token ids", "-")]["ours"] == 0 and rows[("prompt token ids", "-")]["num_tokens"] > 20
    assert rows[("negative prompt token ids ('')", "-")]["ours"] == 0
    for variant in ("t2v", "t2i", "i2v"):
        for case in ("1 step", "3 steps"):  # without guidance, then the recipe's 6.0
            label = f"{variant} {case}"
            assert rows[("latents", label)]["ours"] <= 1e-4
            assert rows[("latents", label)]["yardstick"] is not None
            assert rows[("frames", label)]["ours"] >= 40.0
    assert "| latents | i2v 3 steps | rel err |" in capsys.readouterr().out
