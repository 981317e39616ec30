"""Configs from a folder and the presets, geometry and FLOP counts, and the mode rules."""

import dataclasses
import inspect

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mstar.diffusion.denoise import COND, UNCOND
from mstar.engine.attention import PrefixAttention, StackedPrefixKV, build_attention
from mstar.errors import InvalidParam
from mstar.models.cosmos3 import geometry
from mstar.models.cosmos3.config import (
    EDGE_RECIPE,
    EDGE_TRANSFORMER,
    NANO_TRANSFORMER,
    Cosmos3Config,
    Cosmos3TransformerConfig,
)
from mstar.models.cosmos3.modes import UNBUILT_MODE_FIELDS, Mode, refuse_unbuilt_modes, select_mode
from mstar.models.cosmos3.transformer import Cosmos3Transformer, VisionInput
from mstar.models.cosmos3.weights import load_transformer
from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG


def test_config_from_the_folder(edge_folder):
    folder, pipe = edge_folder
    config = Cosmos3Config.from_folder(folder)
    theirs = pipe.transformer.config
    for field in dataclasses.fields(Cosmos3TransformerConfig):
        expected = getattr(theirs, field.name)
        assert getattr(config.transformer, field.name) == (
            tuple(expected) if isinstance(expected, list) else expected
        )
    assert config.scheduler.flow_shift == pipe.scheduler.config.flow_shift
    assert config.vae.z_dim == pipe.vae.config.z_dim == config.transformer.latent_channel
    assert config.pipeline.use_native_flow_schedule and not config.pipeline.default_use_system_prompt


def test_nano_preset_is_diffusers_defaults():
    from diffusers import Cosmos3OmniTransformer

    defaults = inspect.signature(Cosmos3OmniTransformer.__init__).parameters
    for field in dataclasses.fields(Cosmos3TransformerConfig):
        if field.name == "rope_axes_dim":
            assert NANO_TRANSFORMER.rope_axes_dim == (24, 20, 20)  # diffusers' fallback mrope_section
            continue
        assert getattr(NANO_TRANSFORMER, field.name) == defaults[field.name].default, field.name


@pytest.mark.parametrize("preset", [NANO_TRANSFORMER, EDGE_TRANSFORMER], ids=["nano", "edge"])
def test_presets_build_diffusers_tensors_of_the_same_names_and_shapes(preset):
    """On the meta device: our module holds every tensor of diffusers' but the unused heads."""
    from diffusers import Cosmos3OmniTransformer

    # Edge's action head width (64, read from its checkpoint) only sizes the head we do not build
    kwargs = {**preset.to_dict(), "action_dim": 64} if preset.action_gen else preset.to_dict()
    with torch.device("meta"):
        theirs = {k: tuple(v.shape) for k, v in Cosmos3OmniTransformer(**kwargs).state_dict().items()}
        ours = {k: tuple(v.shape) for k, v in Cosmos3Transformer(preset).state_dict().items()}
    assert {k: theirs[k] for k in ours} == ours
    unused = set(theirs) - set(ours)
    assert all(any(p in k for p in Cosmos3Transformer.unused_checkpoint_patterns) for k in unused)
    assert {k.split(".")[0] for k in unused} == ({"lm_head", "norm"} | ({"action_proj_in", "action_proj_out",
            "action_modality_embed"} if preset.action_gen else set()))  # fmt: skip


def test_edge_recipe_geometry():
    shape = geometry.latent_shape(WAN22_TI2V_5B_VAE_CONFIG, EDGE_RECIPE.num_frames, EDGE_RECIPE.video_height,
                                  EDGE_RECIPE.video_width)  # fmt: skip
    assert shape == (48, 31, 30, 52)
    grid = geometry.patch_grid(shape, EDGE_TRANSFORMER.latent_patch_size)
    assert grid == (31, 15, 26) and geometry.num_vision_tokens(grid) == 12090
    assert geometry.num_noisy_tokens(grid, geometry.IMAGE_CONDITION_FRAMES) == 30 * 15 * 26
    image = geometry.latent_shape(
        WAN22_TI2V_5B_VAE_CONFIG, 1, EDGE_RECIPE.image_height, EDGE_RECIPE.image_width
    )
    assert geometry.patch_grid(image, 2) == (1, 20, 20)
    assert geometry.patch_grid((48, 1, 29, 31), 2) == (1, 15, 16)  # odd sides pad
    assert geometry.guidance_labels(6.0) == (COND, UNCOND) and geometry.guidance_labels(1.0) == (COND,)
    assert geometry.guidance_labels(0.0) == (COND, UNCOND)  # scale 0 is uncond alone, still two passes
    assert geometry.vision_temporal_offset(300, EDGE_TRANSFORMER) == 15300
    assert geometry.fps_modulated(EDGE_TRANSFORMER, 31) and not geometry.fps_modulated(EDGE_TRANSFORMER, 1)


def test_flop_counts_are_the_models_matmuls(edge_folder):
    """Linear layers as torch's FLOP counter sees them, plus the attention the opaque kernel runs."""
    folder, _ = edge_folder
    model = load_transformer(folder, "cpu", torch.float32)
    config = model.config
    attention = build_attention("torch", "cpu", torch.float32)
    num_text, grid = 19, (3, 2, 3)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        prefix = model.understand(list(range(num_text)), attention)
    causal = geometry.attention_flops(config, num_text, (num_text + 1) / 2) * (config.num_hidden_layers - 1)
    assert counter.get_total_flops() + causal == geometry.understanding_flops(config, num_text)
    tokens = geometry.num_vision_tokens(grid)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.generate(
            [VisionInput(torch.zeros(16, 3, 4, 6), 500.0)],
            StackedPrefixKV([prefix]),
            PrefixAttention(attention),
        )
    dense = geometry.attention_flops(config, tokens, num_text + tokens) * config.num_hidden_layers
    assert counter.get_total_flops() + dense == geometry.generation_flops(config, tokens, num_text)
    assert geometry.step_flops(config, tokens, (num_text, 7)) == (
        geometry.generation_flops(config, tokens, num_text) + geometry.generation_flops(config, tokens, 7)
    )


@pytest.mark.parametrize("field", list(UNBUILT_MODE_FIELDS))
def test_unbuilt_modes_are_refused_naming_the_field(field):
    with pytest.raises(InvalidParam) as error:
        refuse_unbuilt_modes({"prompt": "x", field: True if field == "enable_sound" else [0]})
    assert error.value.param == field


def test_a_request_for_sound_is_refused_naming_audio():
    from mstar.graph import GenerationParams
    from mstar.models.cosmos3.model import TinyCosmos3Spec

    spec = TinyCosmos3Spec()
    with pytest.raises(InvalidParam) as error:
        spec.validate(GenerationParams(prompt="a dog barks", audio=True))
    assert error.value.param == "audio" and "sound generation" in str(error.value)
    assert spec.validate(GenerationParams(prompt="a dog", audio=False)).num_frames == 5  # no sound: fine


def test_modes():
    refuse_unbuilt_modes({"prompt": "x", "enable_sound": False, "action": None})
    assert select_mode(1, has_image=False) is Mode.TEXT_TO_IMAGE
    assert select_mode(121, has_image=False) is Mode.TEXT_TO_VIDEO
    assert select_mode(121, has_image=True) is Mode.IMAGE_TO_VIDEO
    with pytest.raises(InvalidParam) as error:
        select_mode(1, has_image=True)
    assert error.value.param == "input_reference"


def test_config_geometry_and_modes_import_no_torch():
    """The API process reads limits and sizes from these without loading torch."""
    import subprocess
    import sys

    code = (
        "import sys; import mstar.models.cosmos3.config, mstar.models.cosmos3.geometry, "
        "mstar.models.cosmos3.modes; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
