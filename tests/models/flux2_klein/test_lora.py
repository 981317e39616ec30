"""FLUX.2 adapters: diffusers' own files, and ai-toolkit's original layout whose fused qkv LoRA
diffusers splits into three projections, map onto every module with diffusers' update; our DiT
with segmented LoRA layers equals Flux2Transformer2DModel with load_lora_weights + set_adapters."""

import re

import pytest
import torch

from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.weights import convert_adapter, load_adapter
from mstar.engine.lora.wrap import LoraLayers, linear_targets
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import Flux2DiT
from mstar.models.flux2_klein.lora_keys import FLUX2_LORA_KEYS
from tests.lora_files import (
    diffusers_loaded,
    linear_names,
    peft_deltas,
    psnr_db,
    save_peft_adapter,
    write_adapter,
)
from tests.models.flux2_klein.test_dit import diffusers_output, make_item, our_outputs
from tests.models.flux2_klein.tiny_parts import tiny_transformer

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")
MIXIN = diffusers.loaders.Flux2LoraLoaderMixin if diffusers else None
RANK = 4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("flux2-loras")


def _ai_toolkit_adapter(model) -> dict[str, torch.Tensor]:
    """Random LoRA weights in the original module names (diffusion_model.double_blocks.N.img_attn.qkv
    ...), one fused qkv per stream and block; shapes from the model's Linears."""
    generator = torch.Generator().manual_seed(7)
    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    shapes = {}
    for src, dst in FLUX2_LORA_KEYS.renames:
        pattern = re.compile("^" + re.escape(dst).replace(re.escape("{i}"), r"(\d+)") + "$")
        for name, linear in linears.items():
            match = pattern.match(name)
            if match:
                original = src.replace("{i}", match.group(1)) if match.groups() else src
                shapes[original] = (linear.out_features, linear.in_features)
    for index in range(TINY.transformer.num_layers):
        attn = linears[f"transformer_blocks.{index}.attn.to_q"]
        for stream in ("img_attn", "txt_attn"):
            shapes[f"double_blocks.{index}.{stream}.qkv"] = (3 * attn.out_features, attn.in_features)
    tensors = {}
    for name, (out_features, in_features) in shapes.items():
        tensors[f"diffusion_model.{name}.lora_A.weight"] = torch.randn(RANK, in_features, generator=generator)
        tensors[f"diffusion_model.{name}.lora_B.weight"] = 0.2 * torch.randn(
            out_features, RANK, generator=generator
        )
    return tensors


def test_peft_file_every_module_gets_diffusers_update(folder):
    model = tiny_transformer()
    names = linear_names(model)
    path = save_peft_adapter(model, MIXIN, folder, "peft", names, seed=3)
    ours = load_adapter(path, FLUX2_LORA_KEYS, names)
    theirs = peft_deltas(diffusers_loaded(MIXIN, tiny_transformer(), {"peft": path}, {"peft": 1.0}), "peft")
    assert set(ours) == set(theirs) == set(names)
    for module, delta in theirs.items():
        torch.testing.assert_close(ours[module].up @ ours[module].down, delta, rtol=1e-5, atol=1e-6)


def test_ai_toolkit_layout_splits_fused_qkv_as_diffusers_does():
    model = tiny_transformer()
    foreign = _ai_toolkit_adapter(model)
    converted = MIXIN.lora_state_dict({k: v.clone() for k, v in foreign.items()})
    ours = convert_adapter(foreign, {}, FLUX2_LORA_KEYS, linear_names(model))
    assert len(ours) * 2 == len(converted)
    assert "transformer_blocks.0.attn.add_k_proj" in ours  # from txt_attn.qkv
    for module, lora in ours.items():
        down = converted[f"transformer.{module}.lora_A.weight"]
        up = converted[f"transformer.{module}.lora_B.weight"]
        torch.testing.assert_close(lora.up @ lora.down, up @ down, rtol=1e-5, atol=1e-6)


def test_dit_with_ai_toolkit_adapter_matches_diffusers(folder):
    path = write_adapter(str(folder / "toolkit.safetensors"), _ai_toolkit_adapter(tiny_transformer()))
    theirs = diffusers_loaded(MIXIN, tiny_transformer(), {"toolkit": path}, {"toolkit": 0.9})
    ours = Flux2DiT(TINY.transformer).eval()
    ours.load_state_dict(tiny_transformer().state_dict())
    layers = LoraLayers(ours, linear_targets(ours), num_slots=1, max_rank=8)
    layers.write(1, layers.pack(load_adapter(path, FLUX2_LORA_KEYS, layers.modules)))
    layers.context.set("tokens", LoraRows.uniform([(1, 0.9)], "cpu", torch.float32))
    item = make_item(4, 6, seed=2)
    (got,) = our_outputs(ours, [item])
    assert psnr_db(got, diffusers_output(theirs, item)) >= 80
    theirs.disable_lora()
    assert psnr_db(got, diffusers_output(theirs, item)) < 40  # the adapter changes the output
