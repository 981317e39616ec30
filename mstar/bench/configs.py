"""The real model configs the benchmarks build with random weights (no downloads), and tiny twins for
CPU tests. Values are those of the published diffusers folders' config.json files.
"""

from __future__ import annotations

import copy
from typing import Any

# Wan-AI/Wan2.2-TI2V-5B-Diffusers transformer/config.json
WAN22_TI2V_5B_TRANSFORMER: dict[str, Any] = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "in_channels": 48,
    "out_channels": 48,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 14336,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
    "pos_embed_seq_len": None,
}

# Wan2.2 VAE (48 latent channels, 16x spatial). latents_mean/std are set to 0/1 here: they only shift
# and scale the latents before decode, which changes no timing, and the real 48 values are not needed.
WAN22_VAE: dict[str, Any] = {
    "base_dim": 160,
    "decoder_base_dim": 256,
    "z_dim": 48,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
    "is_residual": True,
    "in_channels": 12,
    "out_channels": 12,
    "patch_size": 2,
    "scale_factor_temporal": 4,
    "scale_factor_spatial": 16,
    "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
}

WAN22_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "prediction_type": "flow_prediction",
    "use_flow_sigmas": True,
    "flow_shift": 5.0,
}
WAN22_TEXT_TOKENS = 512  # UMT5 embeddings are padded to 512 tokens

# Tongyi-MAI/Z-Image-Turbo transformer/config.json
ZIMAGE_TURBO_TRANSFORMER: dict[str, Any] = {
    "all_patch_size": [2],
    "all_f_patch_size": [1],
    "in_channels": 16,
    "dim": 3840,
    "n_layers": 30,
    "n_refiner_layers": 2,
    "n_heads": 30,
    "n_kv_heads": 30,
    "norm_eps": 1e-5,
    "qk_norm": True,
    "cap_feat_dim": 2560,
    "rope_theta": 256.0,
    "t_scale": 1000.0,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512],
}

# The FLUX-style AutoencoderKL Z-Image uses (16 latent channels, 8x spatial).
ZIMAGE_VAE: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": 16,
    "block_out_channels": [128, 256, 512, 512],
    "layers_per_block": 2,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "act_fn": "silu",
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "mid_block_add_attention": True,
}

ZIMAGE_SCHEDULER: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False}
ZIMAGE_TEXT_TOKENS = 128  # a typical Qwen3 prompt length after padding to 32 (4,096 + 128 = 4,224 tokens)


def tiny_wan_transformer() -> dict[str, Any]:
    config = copy.deepcopy(WAN22_TI2V_5B_TRANSFORMER)
    # head dim 64: the smallest every GPU attention backend (fa3, FlashInfer) takes
    config.update(num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4)
    config.update(text_dim=32, freq_dim=16, ffn_dim=256, num_layers=2, rope_max_seq_len=64)
    return config


def tiny_wan_vae() -> dict[str, Any]:
    config = copy.deepcopy(WAN22_VAE)
    config.update(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    config.update(latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    return config


def tiny_zimage_transformer() -> dict[str, Any]:
    config = copy.deepcopy(ZIMAGE_TURBO_TRANSFORMER)
    config.update(in_channels=4, dim=128, n_layers=2, n_refiner_layers=1, n_heads=2, n_kv_heads=2)
    config.update(cap_feat_dim=16, axes_dims=[16, 24, 24], axes_lens=[64, 32, 32])
    return config


def tiny_zimage_vae() -> dict[str, Any]:
    config = copy.deepcopy(ZIMAGE_VAE)
    config.update(latent_channels=4, block_out_channels=[8, 8, 8, 8], layers_per_block=1, norm_num_groups=4)
    config.update(sample_size=64)
    return config


def configs_for(family: str, tiny: bool = False) -> dict[str, Any]:
    """Transformer, VAE and scheduler configs, text tokens and VAE stride of a model family."""
    if family == "wan":
        transformer = tiny_wan_transformer() if tiny else copy.deepcopy(WAN22_TI2V_5B_TRANSFORMER)
        vae = tiny_wan_vae() if tiny else copy.deepcopy(WAN22_VAE)
        return {
            "transformer": transformer,
            "vae": vae,
            "scheduler": dict(WAN22_SCHEDULER),
            "text_tokens": 8 if tiny else WAN22_TEXT_TOKENS,
            "vae_stride": 16,
        }
    if family == "zimage":
        transformer = tiny_zimage_transformer() if tiny else copy.deepcopy(ZIMAGE_TURBO_TRANSFORMER)
        return {
            "transformer": transformer,
            "vae": tiny_zimage_vae() if tiny else copy.deepcopy(ZIMAGE_VAE),
            "scheduler": dict(ZIMAGE_SCHEDULER),
            "text_tokens": 8 if tiny else ZIMAGE_TEXT_TOKENS,
            "vae_stride": 8,
        }
    raise ValueError(f"unknown model family '{family}' (wan or zimage)")
