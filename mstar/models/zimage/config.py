"""Z-Image-Turbo component configs: the real sizes (as in the released diffusers folder) and tiny
ones for tests. Plain dataclasses, no torch, so the spec can import them cheaply."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DiTConfig:
    """Fields and defaults of diffusers' ZImageTransformer2DModel config.json."""

    all_patch_size: tuple[int, ...] = (2,)
    all_f_patch_size: tuple[int, ...] = (1,)
    in_channels: int = 16
    dim: int = 3840
    n_layers: int = 30
    n_refiner_layers: int = 2
    n_heads: int = 30
    n_kv_heads: int = 30
    norm_eps: float = 1e-5
    qk_norm: bool = True
    cap_feat_dim: int = 2560
    rope_theta: float = 256.0
    t_scale: float = 1000.0
    axes_dims: tuple[int, ...] = (32, 48, 48)
    axes_lens: tuple[int, ...] = (1536, 512, 512)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def patch_size(self) -> int:
        return self.all_patch_size[0]

    @property
    def f_patch_size(self) -> int:
        return self.all_f_patch_size[0]


@dataclass(frozen=True)
class VAEConfig:
    """The decoder half of diffusers' AutoencoderKL config.json (Flux VAE for Z-Image)."""

    latent_channels: int = 16
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    norm_num_groups: int = 32
    mid_block_add_attention: bool = True
    use_post_quant_conv: bool = False
    scaling_factor: float = 0.3611
    shift_factor: float = 0.1159

    @property
    def spatial_scale(self) -> int:
        """Pixels per latent cell along one side."""
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        """The decoder's block widths (FLUX.2's VAE config may narrow them apart from the encoder's)."""
        return self.block_out_channels


@dataclass(frozen=True)
class SchedulerConfig:
    """FlowMatchEulerDiscreteScheduler as Z-Image-Turbo configures it (static shift, no dynamic mu)."""

    num_train_timesteps: int = 1000
    shift: float = 3.0
    use_dynamic_shifting: bool = False
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    base_shift: float = 0.5
    max_shift: float = 1.15


# Qwen3-4B (the text_encoder/config.json of Z-Image-Turbo); passed to transformers.Qwen3Config.
QWEN3_4B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

TINY_QWEN3: dict[str, Any] = {
    **QWEN3_4B,
    "vocab_size": 320,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 1024,
    "bos_token_id": None,
    "eos_token_id": None,
}


@dataclass(frozen=True)
class ZImageConfig:
    dit: DiTConfig = field(default_factory=DiTConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    text_encoder: dict[str, Any] = field(default_factory=lambda: dict(QWEN3_4B))
    max_sequence_length: int = 512


REAL = ZImageConfig()

TINY = ZImageConfig(
    dit=DiTConfig(
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,
        axes_dims=(8, 4, 4),
        axes_lens=(1024, 64, 64),
    ),
    vae=VAEConfig(block_out_channels=(32, 32), layers_per_block=1, norm_num_groups=8),
    text_encoder=dict(TINY_QWEN3),
)


def from_json_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build a config dataclass from a diffusers config.json dict, ignoring unknown keys
    (`_class_name`, `_diffusers_version`, encoder-only fields)."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in known and value is not None:
            values[key] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def to_json_dict(config: Any) -> dict[str, Any]:
    """The diffusers-shaped config.json dict (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def diffusers_vae_config(vae: VAEConfig) -> dict[str, Any]:
    """diffusers' AutoencoderKL kwargs of the VAE whose decoder half `vae` describes."""
    num_blocks = len(vae.block_out_channels)
    return {
        **to_json_dict(vae),
        "in_channels": 3,
        "down_block_types": ["DownEncoderBlock2D"] * num_blocks,
        "up_block_types": ["UpDecoderBlock2D"] * num_blocks,
        "use_quant_conv": False,
    }
