"""The klein configs: presets consistent with each other, read back from a saved folder."""

import dataclasses

import pytest

from mstar.models.flux2_klein.config import (
    KLEIN_4B,
    KLEIN_9B,
    PRESETS,
    TINY,
    Flux2KleinConfig,
    TransformerConfig,
    from_json_dict,
    load_config,
    to_json_dict,
)


def test_presets_have_the_released_shapes():
    assert (KLEIN_4B.transformer.num_layers, KLEIN_4B.transformer.num_single_layers) == (5, 20)
    assert (KLEIN_9B.transformer.num_layers, KLEIN_9B.transformer.num_single_layers) == (8, 24)
    assert KLEIN_4B.transformer.inner_dim == 3072 and KLEIN_9B.transformer.inner_dim == 4096
    assert KLEIN_4B.text_encoder["hidden_size"] * 3 == KLEIN_4B.transformer.joint_attention_dim == 7680
    assert KLEIN_9B.text_encoder["hidden_size"] * 3 == KLEIN_9B.transformer.joint_attention_dim == 12288
    assert KLEIN_4B.vae.patchified_channels == 128 and KLEIN_4B.vae.spatial_scale == 8
    assert PRESETS["klein-4b"].is_distilled and not PRESETS["klein-base-9b"].is_distilled


def test_load_config_reads_the_saved_folder(tiny_folder):
    folder, _ = tiny_folder
    config = load_config(folder, TINY)
    assert config.transformer == TINY.transformer
    assert config.vae == TINY.vae
    assert config.scheduler == TINY.scheduler
    assert config.is_distilled
    assert config.text_encoder["hidden_size"] == TINY.text_encoder["hidden_size"]
    assert load_config(None, KLEIN_9B) is KLEIN_9B


def test_from_json_dict_ignores_unknown_keys_and_nulls():
    data = {"_class_name": "Flux2Transformer2DModel", "num_layers": 3, "out_channels": None, "eps": None}
    config = from_json_dict(TransformerConfig, data)
    assert config.num_layers == 3 and config.out_channels is None and config.eps == 1e-6
    assert from_json_dict(TransformerConfig, to_json_dict(KLEIN_9B.transformer)) == KLEIN_9B.transformer


def test_mismatched_text_width_is_refused():
    with pytest.raises(ValueError, match="text encoder layers"):
        dataclasses.replace(KLEIN_4B, text_encoder={**KLEIN_4B.text_encoder, "hidden_size": 4096})
    with pytest.raises(ValueError, match="patchified latents"):
        Flux2KleinConfig(vae=dataclasses.replace(KLEIN_4B.vae, latent_channels=16))
