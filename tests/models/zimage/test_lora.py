"""Z-Image adapters: diffusers' own files and kohya's underscored layout map onto every module with
diffusers' update, and our DiT with segmented LoRA layers equals ZImageTransformer2DModel with
load_lora_weights + set_adapters."""

import pytest
import torch

from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.weights import convert_adapter, load_adapter
from mstar.engine.lora.wrap import LoraLayers, linear_targets
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import ZImageDiT
from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS
from tests.lora_files import diffusers_loaded, linear_names, peft_deltas, psnr_db, save_peft_adapter
from tests.models.zimage.test_dit import diffusers_outputs, make_items, our_outputs
from tests.models.zimage.tiny_parts import tiny_transformer

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")
MIXIN = diffusers.loaders.ZImageLoraLoaderMixin if diffusers else None


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    model = tiny_transformer()
    names = linear_names(model)
    folder = tmp_path_factory.mktemp("zimage-loras")
    return save_peft_adapter(model, MIXIN, folder, "style", names, seed=4, r=8, lora_alpha=12), names


def test_every_module_gets_diffusers_update(adapter):
    path, names = adapter
    ours = load_adapter(path, ZIMAGE_LORA_KEYS, names)
    theirs = peft_deltas(
        diffusers_loaded(MIXIN, tiny_transformer(), {"style": path}, {"style": 1.0}), "style"
    )
    assert set(ours) == set(theirs) == set(names)
    for module, delta in theirs.items():
        torch.testing.assert_close(ours[module].up @ ours[module].down, delta, rtol=1e-5, atol=1e-6)


def test_kohya_layout_converts_as_diffusers_does(adapter):
    """lora_unet_<module with underscores>.lora_down/up + alpha, the output projection as `out`."""
    from safetensors.torch import load_file

    path, names = adapter
    foreign = {}
    for key, value in load_file(path).items():
        module, _, role = key.removeprefix("transformer.").rpartition(".lora_")
        module = module.replace(".to_out.0", ".out")
        name = "lora_unet_" + module.replace(".", "_")
        foreign[f"{name}.{'lora_down' if role.startswith('A') else 'lora_up'}.weight"] = value
        if role.startswith("A"):
            foreign[f"{name}.alpha"] = torch.tensor(0.5 * value.shape[0])
    converted = MIXIN.lora_state_dict({k: v.clone() for k, v in foreign.items()})
    ours = convert_adapter(foreign, {}, ZIMAGE_LORA_KEYS, names)
    assert len(ours) * 2 == len(converted)
    for module, lora in ours.items():
        down = converted[f"transformer.{module}.lora_A.weight"]
        up = converted[f"transformer.{module}.lora_B.weight"]
        torch.testing.assert_close(lora.up @ lora.down, up @ down, rtol=1e-5, atol=1e-6)


def test_dit_with_adapter_matches_diffusers(adapter):
    path, _ = adapter
    theirs = diffusers_loaded(MIXIN, tiny_transformer(), {"style": path}, {"style": 0.6})
    ours = ZImageDiT(TINY.dit).eval()
    ours.load_state_dict(tiny_transformer().state_dict())
    layers = LoraLayers(ours, linear_targets(ours), num_slots=1, max_rank=8)
    layers.write(1, layers.pack(load_adapter(path, ZIMAGE_LORA_KEYS, layers.modules)))
    layers.context.set("tokens", LoraRows.uniform([(1, 0.6)], "cpu", torch.float32))
    items = make_items([(8, 6, 9)], seed=5)
    (got,) = our_outputs(ours, items)
    (expected,) = diffusers_outputs(theirs, items)
    assert psnr_db(got, expected) >= 80
    layers.context.clear()
    (base,) = our_outputs(ours, items)
    theirs.disable_lora()
    (expected_base,) = diffusers_outputs(theirs, items)
    assert psnr_db(base, expected_base) >= 80
    assert psnr_db(got, base) < 40  # the adapter changes the output
