"""Diffusers-layout loading: single and sharded safetensors, errors naming tensors, seeded random weights."""

import json

import pytest
import torch
from torch import nn

from mstar.models.checkpoint import (
    CheckpointError,
    build_module,
    component_path,
    read_config,
    safetensors_files,
)

diffusers = pytest.importorskip("diffusers")


class Small(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.proj = nn.Linear(4, width)
        self.norm = nn.LayerNorm(width)
        self.time_embedder = nn.Linear(width, 2)


def _write_model_folder(tmp_path, module, max_shard_size=None):
    from safetensors.torch import save_file

    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "Test", "transformer": ["x", "y"]}))
    folder = tmp_path / "transformer"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"width": 8}))
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    if max_shard_size is None:
        save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
        return folder
    names = sorted(state)
    weight_map = {}
    for shard, chunk in enumerate([names[:2], names[2:]]):
        filename = f"diffusion_pytorch_model-0000{shard + 1}-of-00002.safetensors"
        save_file({n: state[n] for n in chunk}, str(folder / filename))
        weight_map.update({n: filename for n in chunk})
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("sharded", [False, True])
def test_loads_single_and_sharded_to_dtype_keeping_fp32_parts(tmp_path, sharded):
    torch.manual_seed(0)
    source = Small()
    folder = _write_model_folder(tmp_path, source, max_shard_size=1 if sharded else None)
    assert component_path(tmp_path, "transformer") == folder
    assert read_config(folder) == {"width": 8}
    assert len(safetensors_files(folder)) == (2 if sharded else 1)
    seen = []
    loaded = build_module(
        Small, "cpu", torch.bfloat16, folder=folder, keep_fp32=("time_embedder",),
        progress=lambda label, done, total: seen.append((done, total)),
    )  # fmt: skip
    assert loaded.proj.weight.dtype == torch.bfloat16
    assert loaded.time_embedder.weight.dtype == torch.float32
    assert torch.equal(loaded.time_embedder.weight, source.time_embedder.weight)
    assert torch.equal(loaded.proj.weight, source.proj.weight.to(torch.bfloat16))
    assert seen[-1] == (6, 6) and not loaded.training


def test_missing_unexpected_and_mismatched_tensors_are_named(tmp_path):
    folder = _write_model_folder(tmp_path, Small())
    with pytest.raises(CheckpointError, match="shape"):
        build_module(lambda: Small(width=6), "cpu", torch.float32, folder=folder)

    class Bigger(Small):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(2, 2)

    with pytest.raises(CheckpointError, match="missing tensor 'extra"):
        build_module(Bigger, "cpu", torch.float32, folder=folder)

    class Fewer(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 8)

    with pytest.raises(CheckpointError, match="unexpected tensor '(norm|time_embedder)"):
        build_module(Fewer, "cpu", torch.float32, folder=folder)
    with pytest.raises(CheckpointError, match="no 'vae' folder"):
        component_path(tmp_path, "vae")
    with pytest.raises(CheckpointError, match="model_index.json"):
        component_path(folder, "x")


def test_random_weights_are_seeded_and_sane():
    first = build_module(Small, "cpu", torch.bfloat16, seed=3)
    again = build_module(Small, "cpu", torch.bfloat16, seed=3)
    other = build_module(Small, "cpu", torch.bfloat16, seed=4)
    assert first.proj.weight.dtype == torch.bfloat16
    assert torch.equal(first.proj.weight, again.proj.weight)
    assert not torch.equal(first.proj.weight, other.proj.weight)
    assert torch.equal(first.norm.weight, torch.ones(8, dtype=torch.bfloat16))
    assert 0.2 < float(first.proj.weight.float().std()) < 0.8  # ~ 1/sqrt(fan_in = 4)


def test_wan_dit_from_diffusers_save_pretrained(tmp_path):
    from mstar.engine.attention import build_attention
    from mstar.models.wan22.config import WanDiTConfig, tiny_wan22_config
    from mstar.models.wan22.dit import DiTInput, WanDiT

    config = tiny_wan22_config().dit
    torch.manual_seed(1)
    theirs = diffusers.WanTransformer3DModel(**config.to_dict())
    theirs.save_pretrained(tmp_path / "transformer", max_shard_size="20KB")
    (tmp_path / "model_index.json").write_text("{}")
    folder = component_path(tmp_path, "transformer")
    assert len(safetensors_files(folder)) > 1
    loaded_config = WanDiTConfig.from_dict(read_config(folder))
    assert loaded_config == config
    ours = build_module(lambda: WanDiT(loaded_config), "cpu", torch.float32, folder=folder)
    latents, text = torch.randn(16, 2, 4, 4), torch.randn(5, 16)
    (out,) = ours([DiTInput(latents, 500.0, text)], build_attention("torch", "cpu", torch.float32))
    with torch.no_grad():
        expected = theirs(latents[None], torch.tensor([500.0]), text[None], return_dict=False)[0][0]
    assert float((out - expected).norm() / expected.norm()) <= 1e-5
