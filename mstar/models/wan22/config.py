"""Wan2.2-TI2V-5B component configs (as in the diffusers checkpoint folders) and a tiny test config.

Plain dicts and dataclasses, no torch: model.py reads the request limits from here without loading
anything. Keys are the diffusers / transformers config keys so a checkpoint's config.json drops in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from mstar.diffusion.scheduler_config import UniPCConfig


@dataclass(frozen=True)
class WanDiTConfig:
    """diffusers WanTransformer3DModel config (Wan2.2-TI2V-5B values by default)."""

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 24
    attention_head_dim: int = 128
    in_channels: int = 48
    out_channels: int = 48
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 14336
    num_layers: int = 30
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    rope_max_seq_len: int = 1024

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> WanDiTConfig:
        """From a transformer/config.json; image-conditioning (Wan2.1 I2V) checkpoints are refused."""
        for key in ("image_dim", "added_kv_proj_dim", "pos_embed_seq_len"):
            if config.get(key) is not None:
                raise ValueError(f"Wan DiT config: '{key}' (CLIP image conditioning) is not supported")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        if "patch_size" in values:
            values["patch_size"] = tuple(values["patch_size"])
        if values.get("out_channels") is None:
            values["out_channels"] = values.get("in_channels", cls.in_channels)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["patch_size"] = list(self.patch_size)
        return values


# Per-channel statistics of the Wan2.2 VAE latents (vae/config.json latents_mean / latents_std).
WAN22_LATENTS_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]  # fmt: skip
WAN22_LATENTS_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]  # fmt: skip

# diffusers AutoencoderKLWan config of Wan2.2-TI2V-5B (16x spatial, 4x temporal, 48 channels).
WAN22_VAE_CONFIG: dict[str, Any] = {
    "attn_scales": [],
    "base_dim": 160,
    "decoder_base_dim": 256,
    "dim_mult": [1, 2, 4, 4],
    "dropout": 0.0,
    "in_channels": 12,
    "out_channels": 12,
    "is_residual": True,
    "latents_mean": WAN22_LATENTS_MEAN,
    "latents_std": WAN22_LATENTS_STD,
    "num_res_blocks": 2,
    "patch_size": 2,
    "scale_factor_spatial": 16,
    "scale_factor_temporal": 4,
    "temperal_downsample": [False, True, True],
    "z_dim": 48,
}

# transformers UMT5EncoderModel config (umt5-xxl encoder).
WAN22_TEXT_ENCODER_CONFIG: dict[str, Any] = {
    "model_type": "umt5",
    "d_model": 4096,
    "d_ff": 10240,
    "d_kv": 64,
    "num_heads": 64,
    "num_layers": 24,
    "vocab_size": 256384,
    "feed_forward_proj": "gated-gelu",
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "layer_norm_epsilon": 1e-6,
    "dropout_rate": 0.1,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "decoder_start_token_id": 0,
}

# diffusers UniPCMultistepScheduler settings of Wan2.2-TI2V-5B (see mstar.diffusion.samplers).
WAN22_SCHEDULER = {"flow_shift": 5.0, "solver_order": 2, "solver_type": "bh2", "num_train_timesteps": 1000}

# The scheduler/scheduler_config.json of Wan-AI/Wan2.2-TI2V-5B-Diffusers.
WAN22_SCHEDULER_CONFIG: dict[str, Any] = {
    "_class_name": "UniPCMultistepScheduler",
    "beta_end": 0.02, "beta_schedule": "linear", "beta_start": 0.0001, "disable_corrector": [],
    "dynamic_thresholding_ratio": 0.995, "final_sigmas_type": "zero", "flow_shift": 5.0,
    "lower_order_final": True, "num_train_timesteps": 1000, "predict_x0": True,
    "prediction_type": "flow_prediction", "rescale_betas_zero_snr": False, "sample_max_value": 1.0,
    "solver_order": 2, "solver_p": None, "solver_type": "bh2", "steps_offset": 0, "thresholding": False,
    "timestep_spacing": "linspace", "trained_betas": None, "use_beta_sigmas": False,
    "use_exponential_sigmas": False, "use_flow_sigmas": True, "use_karras_sigmas": False,
}  # fmt: skip


@dataclass(frozen=True)
class Wan22Config:
    """Everything a Wan2.2 build needs: component configs plus request defaults and limits."""

    dit: WanDiTConfig = field(default_factory=WanDiTConfig)
    vae: dict[str, Any] = field(default_factory=lambda: dict(WAN22_VAE_CONFIG))
    text_encoder: dict[str, Any] = field(default_factory=lambda: dict(WAN22_TEXT_ENCODER_CONFIG))
    max_text_tokens: int = 512
    scheduler: UniPCConfig = UniPCConfig(flow_shift=5.0)  # a folder's scheduler_config.json replaces it
    vae_scale_spatial: int = 16
    vae_scale_temporal: int = 4
    default_width: int = 1280
    default_height: int = 704
    default_num_frames: int = 121
    default_fps: int = 24
    default_steps: int = 50
    default_guidance: float = 5.0
    size_multiple: int = 32  # VAE 16x times the DiT's 2x2 patch
    # 1280 (the trained 720p side, either orientation): at the default 121 frames with guidance a
    # 1280x1280 step is 99200 tokens, under the default max_tokens_per_step (131072); 1920 was not.
    max_width: int = 1280
    max_height: int = 1280
    max_num_frames: int = 241
    max_steps: int = 200


def tiny_wan22_config() -> Wan22Config:
    """A few-kilobyte Wan2.2 for CPU tests: 2 layers, 32-wide, 16-channel latents, 16-dim text."""
    dit = WanDiTConfig(
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=16,
        freq_dim=16,
        ffn_dim=32,
        num_layers=2,
        rope_max_seq_len=64,
    )
    vae = {
        "attn_scales": [],
        "base_dim": 8,
        "decoder_base_dim": 8,
        "dim_mult": [1, 2, 2],
        "dropout": 0.0,
        "in_channels": 12,
        "out_channels": 12,
        "is_residual": True,
        "latents_mean": [0.1 * (i % 5) - 0.2 for i in range(16)],
        "latents_std": [0.5 + 0.1 * (i % 3) for i in range(16)],
        "num_res_blocks": 1,
        "patch_size": 2,
        "scale_factor_spatial": 8,
        "scale_factor_temporal": 4,
        "temperal_downsample": [True, True],
        "z_dim": 16,
    }
    text_encoder = dict(
        WAN22_TEXT_ENCODER_CONFIG, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, vocab_size=384
    )
    return Wan22Config(
        dit=dit,
        vae=vae,
        text_encoder=text_encoder,
        max_text_tokens=16,
        vae_scale_spatial=8,
        vae_scale_temporal=4,
        default_width=32,
        default_height=32,
        default_num_frames=5,
        default_fps=8,
        default_steps=4,
        size_multiple=16,
    )
