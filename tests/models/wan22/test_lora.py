"""Wan2.2 adapters: files diffusers' save_lora_weights writes (and the original / musubi layouts
diffusers converts) map onto every module with diffusers' own update, and our DiT with the
segmented LoRA layers equals WanTransformer3DModel with load_lora_weights + set_adapters."""

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.weights import convert_adapter, load_adapter
from mstar.engine.lora.wrap import LoraLayers, linear_targets
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
from tests.lora_files import diffusers_loaded, linear_names, peft_deltas, psnr_db, save_peft_adapter

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")


def _model(seed=0):
    torch.manual_seed(seed)
    return diffusers.WanTransformer3DModel(**tiny_wan22_config().dit.to_dict()).eval()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """Two adapters on every Linear: one plain, one with a rank and alpha pattern and rsLoRA."""
    folder = tmp_path_factory.mktemp("wan-loras")
    model = _model()
    names = linear_names(model)
    mixin = diffusers.loaders.WanLoraLoaderMixin
    plain = save_peft_adapter(model, mixin, folder, "plain", names, seed=1)
    patterned = save_peft_adapter(
        model,
        mixin,
        folder,
        "patterned",
        names,
        seed=2,
        r=8,
        lora_alpha=4,
        rank_pattern={"blocks.0.attn1.to_q": 2},
        alpha_pattern={"ffn.net.2": 16},
        use_rslora=True,
    )
    return {"plain": plain, "patterned": patterned}, names


@pytest.mark.parametrize("name", ["plain", "patterned"])
def test_every_module_gets_diffusers_update(adapters, name):
    paths, names = adapters
    ours = load_adapter(paths[name], WAN22_LORA_KEYS, names)
    theirs = peft_deltas(
        diffusers_loaded(diffusers.loaders.WanLoraLoaderMixin, _model(), {name: paths[name]}, {name: 1.0}),
        name,
    )
    assert set(ours) == set(theirs) == set(names)
    for module, delta in theirs.items():
        torch.testing.assert_close(ours[module].up @ ours[module].down, delta, rtol=1e-5, atol=1e-6)


def _original_layout(state: dict[str, torch.Tensor], musubi: bool) -> dict[str, torch.Tensor]:
    """The diffusers-format file in the original checkpoint's names (diffusion_model. ... lora_down,
    blocks with alpha = 2 x rank), or musubi's underscored names."""
    inverse = {dst: src for src, dst in WAN22_LORA_KEYS.renames}
    out = {}
    for key, value in state.items():
        module, _, role = key.removeprefix("transformer.").rpartition(".lora_")
        parts = module.split(".")
        block = next((f"blocks.{{i}}.{'.'.join(parts[2:])}" for _ in [0] if parts[0] == "blocks"), module)
        original = inverse[block].replace("{i}", parts[1]) if parts[0] == "blocks" else inverse[module]
        kind = "lora_down" if role.startswith("A") else "lora_up"
        name = f"lora_unet_{original.replace('.', '_')}" if musubi else f"diffusion_model.{original}"
        out[f"{name}.{kind}.weight"] = value
        if kind == "lora_down" and parts[0] == "blocks":  # diffusers reads alphas of blocks only
            out[f"{name}.alpha"] = torch.tensor(2.0 * value.shape[0])
    return out


@pytest.mark.parametrize("musubi", [False, True], ids=["original", "musubi"])
def test_original_layouts_convert_as_diffusers_does(adapters, musubi):
    from safetensors.torch import load_file

    paths, names = adapters
    state = load_file(paths["plain"])
    if musubi:  # musubi files carry the transformer blocks only
        state = {k: v for k, v in state.items() if k.startswith("transformer.blocks.")}
    foreign = _original_layout(state, musubi)
    # diffusers scales some tensors in place: give it copies
    converted = diffusers.loaders.WanLoraLoaderMixin.lora_state_dict(
        {k: v.clone() for k, v in foreign.items()}
    )
    ours = convert_adapter(foreign, {}, WAN22_LORA_KEYS, names)
    assert len(ours) * 2 == len(converted)
    for module, lora in ours.items():
        down = converted[f"transformer.{module}.lora_A.weight"]
        up = converted[f"transformer.{module}.lora_B.weight"]
        torch.testing.assert_close(lora.up @ lora.down, up @ down, rtol=1e-5, atol=1e-6)


def _item(seed, frames=2, height=8, width=8, timestep=611.0):
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(16, frames, height, width, generator=generator)
    return DiTInput(latents, timestep, torch.randn(12, 16, generator=generator))


def _diffusers_velocity(model, item):
    _, frames, height, width = item.latents.shape
    per_token = torch.full((1, frames * (height // 2) * (width // 2)), item.timestep)
    with torch.no_grad():
        return model(item.latents[None], per_token, item.text[None], return_dict=False)[0][0]


def test_dit_with_two_adapters_matches_diffusers(adapters):
    paths, names = adapters
    scales = {"plain": 0.7, "patterned": -0.4}
    theirs = diffusers_loaded(diffusers.loaders.WanLoraLoaderMixin, _model(), paths, scales)
    ours = WanDiT(tiny_wan22_config().dit).eval()
    ours.load_state_dict(_model().state_dict())
    layers = LoraLayers(ours, linear_targets(ours), num_slots=2, max_rank=8)
    for slot, name in enumerate(scales, start=1):
        layers.write(slot, layers.pack(load_adapter(paths[name], WAN22_LORA_KEYS, layers.modules)))
    item = _item(3)
    rows = LoraRows.uniform([(1, 0.7), (2, -0.4)], "cpu", torch.float32)
    for layout in {t.layout for t in layers.targets}:
        layers.context.set(layout, rows)
    with torch.no_grad():
        (got,) = ours([item], build_attention("torch", "cpu", torch.float32))
    expected = _diffusers_velocity(theirs, item)
    assert psnr_db(got, expected) >= 80
    theirs.disable_lora()
    base = _diffusers_velocity(theirs, item)
    assert psnr_db(got, base) < 40  # the adapters change the output


@pytest.mark.parametrize(
    "module",
    ["condition_embedder.time_embedder.linear_1", "condition_embedder.time_proj", "time_embedding.2"],
)
def test_an_adapter_on_the_timestep_embedder_is_refused_naming_the_module(module):
    """The timestep embedder and time_proj run one row per item outside the packed step and take no
    LoRA: an adapter updating one (diffusers' or the original checkpoint's name) fails when loaded."""
    from mstar.adapters import AdapterFileError
    from mstar.models.wan22.lora import wan_lora_targets

    dit = WanDiT(tiny_wan22_config().dit)
    layers = LoraLayers(dit, wan_lora_targets(dit), num_slots=1, max_rank=8)
    tensors = {
        "transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, dit.blocks[0].attn1.to_q.in_features),
        "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.zeros(
            dit.blocks[0].attn1.to_q.out_features, 4
        ),
        f"transformer.{module}.lora_A.weight": torch.zeros(4, 8),
        f"transformer.{module}.lora_B.weight": torch.zeros(8, 4),
    }
    with pytest.raises(AdapterFileError, match=module.replace(".", r"\.")):
        convert_adapter(tensors, {}, WAN22_LORA_KEYS, layers.modules)
