"""`mstar bench parity`: end to end on a tiny config on the CPU (the GPU run at full size is the same
code), and the pieces its figures rest on."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mstar.bench.cli import main
from mstar.bench.parity import (
    ParityCase,
    ParityOptions,
    _families,
    eager_attention,
    parity_table,
    perturbed_input_embeddings,
    psnr_db,
    rel_err,
    with_default_steps,
)
from mstar.bench.parity_families import parity_family


def test_relative_error_and_psnr():
    theirs = torch.tensor([[3.0, 4.0]])
    assert rel_err(theirs[0], theirs) == 0.0  # leading 1s dropped
    assert rel_err(torch.tensor([3.0, 5.0]), theirs) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="shapes differ"):
        rel_err(torch.zeros(3), theirs)
    pixels = np.array([[0, 128, 255]], dtype=np.uint8)
    assert psnr_db(pixels, pixels / 255.0) == float("inf")  # floats are rounded to pixel levels
    assert psnr_db(pixels, (pixels + 0.4) / 255.0) == float("inf")
    assert psnr_db(pixels, np.array([[0, 129, 255]]) / 255.0) == pytest.approx(10 * np.log10(3 * 255.0**2))


def test_cases_and_families():
    cases = [ParityCase("1 step", 1, 1.0), ParityCase("50 steps", 50, 5.0)]
    assert with_default_steps(cases, 6) == [cases[0], ParityCase("6 steps", 6, 5.0)]
    assert parity_family("wan2.2-ti2v-5b", tiny=True).variant == "t2v"
    assert parity_family("wan2.2-ti2v-5b", "i2v", tiny=True).input_image.shape == (32, 32, 3)
    assert parity_family("z-image-turbo", tiny=True).cases[-1].guidance_scale == 0.0
    with pytest.raises(ValueError, match="no parity hook"):
        parity_family("tiny-digits")
    with pytest.raises(ValueError, match="variant"):
        parity_family("z-image-turbo", "i2v")
    both = _families(ParityOptions("wan2.2-ti2v-5b", variant="t2v,i2v", tiny=True, num_inference_steps=3))
    assert [f.variant for f in both] == ["t2v", "i2v"] and both[1].cases[-1] == ParityCase("3 steps", 3, 5.0)


def _tiny_umt5():
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    config = UMT5Config(d_model=16, d_ff=32, d_kv=4, num_heads=4, num_layers=2, vocab_size=50)
    return UMT5EncoderModel(config).eval()


@torch.inference_mode()
def test_the_yardsticks_change_the_computation_and_leave_the_model_as_it_was():
    model = _tiny_umt5()
    ids = torch.tensor([[5, 7, 9, 1]])
    clean = model(ids).last_hidden_state
    with perturbed_input_embeddings(model, 1e-3, seed=1):
        perturbed = model(ids).last_hidden_state
    assert 1e-5 < rel_err(perturbed, clean) < 1e-1
    assert torch.equal(model(ids).last_hidden_state, clean)  # the hooks are gone
    before = model.config._attn_implementation
    with eager_attention(model):
        assert model.config._attn_implementation == model.encoder.config._attn_implementation == "eager"
        eager = model(ids).last_hidden_state
    assert model.config._attn_implementation == before
    assert rel_err(eager, clean) < 1e-5


def test_parity_runs_end_to_end_on_a_tiny_config(tmp_path, capsys):
    output = tmp_path / "parity.json"
    folder = tmp_path / "reference"
    argv = ["parity", "wan2.2-ti2v-5b", "--tiny", "--device", "cpu", "--steps", "2", "--folder", str(folder)]
    assert main([*argv, "-o", str(output)]) == 0
    assert folder.is_dir() and not any(folder.iterdir())  # the reference written in it is removed
    result = json.loads(output.read_text())
    rows = {(row["quantity"], row["case"]): row for row in result["rows"]}
    assert rows[("prompt embeddings", "-")]["ours"] <= 1e-5
    assert rows[("prompt embeddings", "-")]["num_tokens"] > 1
    assert rows[("negative prompt embeddings ('')", "-")]["ours"] <= 1e-5
    assert rows[("text encoder sensitivity", "-")]["yardstick"] < 1e-2  # the tiny encoder is not chaotic
    for case in ("1 step", "2 steps"):
        assert rows[("latents", case)]["ours"] <= 1e-4
        assert rows[("latents", case)]["yardstick"] is not None
        assert rows[("frames", case)]["ours"] >= 40.0
    assert any(quantity.startswith("prompt embeddings, ours padded") for quantity, _ in rows)
    printed = capsys.readouterr().out
    assert "| latents | 2 steps | rel err |" in printed and parity_table(result) in printed


def test_the_prompt_encoder_timing_runs_on_a_tiny_config():
    from mstar.bench.prompt_encoder_speed import PROMPTS, measure, table
    from mstar.models.wan22.config import tiny_wan22_config

    rows = measure(num_timed=1, device="cpu", config=tiny_wan22_config())
    assert len(rows) == 2 * len(PROMPTS)
    for row in rows:
        assert 1 <= row["num_tokens"] <= row["bucket"] and row["device_ms"] > 0
    assert table(rows).count("\n") == len(rows) + 1
