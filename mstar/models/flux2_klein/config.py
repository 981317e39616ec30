"""FLUX.2 [klein] component configs: typed views of a diffusers folder's config.json files, with
the released klein 4B and 9B values as presets and tiny ones for tests. Plain dataclasses, no
torch, so the spec and the geometry import them cheaply.

Where the preset values come from (the released folders are not reachable from here):
- transformer: diffusers' scripts/convert_flux2_to_diffusers.py (`klein-4b`, `klein-9b`), the
  same values as the klein-base-4B transformer/config.json written by that script;
- vae: the klein-4B and klein-base-9B vae/config.json (AutoencoderKLFlux2, identical for both);
- text encoder: Qwen/Qwen3-4B and Qwen/Qwen3-8B config.json (Qwen3ForCausalLM), the encoders the
  klein 4B and 9B model cards name; hidden size x 3 layers = the transformer's joint_attention_dim;
- scheduler: FLUX.2-dev's scheduler_config.json (klein's own was not found; a --model-path folder
  is read as it is). BFL's reference sampler uses the same exponential time shift with mu;
- is_distilled: model_index.json of FLUX.2-klein-9B (true); the klein-base folders omit it (false).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TransformerConfig:
    """Flux2Transformer2DModel's config.json (klein 4B values)."""

    patch_size: int = 1
    in_channels: int = 128
    out_channels: int | None = None
    num_layers: int = 5
    num_single_layers: int = 20
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 7680
    timestep_guidance_channels: int = 256
    mlp_ratio: float = 3.0
    axes_dims_rope: tuple[int, ...] = (32, 32, 32, 32)
    rope_theta: int = 2000
    eps: float = 1e-6
    guidance_embeds: bool = False

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def num_out_channels(self) -> int:
        return self.out_channels or self.in_channels

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.inner_dim * self.mlp_ratio)


@dataclass(frozen=True)
class VAEConfig:
    """AutoencoderKLFlux2's config.json."""

    in_channels: int = 3
    out_channels: int = 3
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    layers_per_block: int = 2
    latent_channels: int = 32
    norm_num_groups: int = 32
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    batch_norm_eps: float = 1e-4
    patch_size: tuple[int, int] = (2, 2)

    @property
    def spatial_scale(self) -> int:
        """Pixels per (unpatchified) latent cell along one side."""
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        return self.decoder_block_out_channels or self.block_out_channels

    @property
    def patchified_channels(self) -> int:
        """Channels of the patchified latents the transformer reads (and of the batch-norm stats)."""
        return self.patch_size[0] * self.patch_size[1] * self.latent_channels


@dataclass(frozen=True)
class SchedulerConfig:
    """FlowMatchEulerDiscreteScheduler's scheduler_config.json as FLUX.2 ships it. The pipeline
    passes its own sigmas and mu, so with dynamic shifting `shift` and the seq-len bounds are unused."""

    num_train_timesteps: int = 1000
    shift: float = 3.0
    use_dynamic_shifting: bool = True
    time_shift_type: str = "exponential"
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    base_shift: float = 0.5
    max_shift: float = 1.15


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

QWEN3_8B: dict[str, Any] = {
    **QWEN3_4B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
}

TINY_QWEN3: dict[str, Any] = {
    **QWEN3_4B,
    "vocab_size": 320,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 1024,
    "bos_token_id": None,
    "eos_token_id": None,
}

# Which hidden states the pipeline stacks (its `text_encoder_out_layers` default) and how many
# tokens every prompt is padded (and truncated) to.
TEXT_ENCODER_OUT_LAYERS = (9, 18, 27)
MAX_SEQUENCE_LENGTH = 512


@dataclass(frozen=True)
class Flux2KleinConfig:
    transformer: TransformerConfig = field(default_factory=TransformerConfig)
    vae: VAEConfig = field(default_factory=VAEConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    text_encoder: dict[str, Any] = field(default_factory=lambda: dict(QWEN3_4B))
    text_encoder_out_layers: tuple[int, ...] = TEXT_ENCODER_OUT_LAYERS
    max_sequence_length: int = MAX_SEQUENCE_LENGTH
    is_distilled: bool = True

    def __post_init__(self) -> None:
        text_dim = len(self.text_encoder_out_layers) * self.text_encoder["hidden_size"]
        if text_dim != self.transformer.joint_attention_dim:
            raise ValueError(
                f"{len(self.text_encoder_out_layers)} text encoder layers of {self.text_encoder['hidden_size']} "
                f"give {text_dim} features, the transformer reads {self.transformer.joint_attention_dim}"
            )
        if self.vae.patchified_channels != self.transformer.in_channels:
            raise ValueError(
                f"the VAE's patchified latents have {self.vae.patchified_channels} channels, "
                f"the transformer reads {self.transformer.in_channels}"
            )


KLEIN_4B = Flux2KleinConfig()

KLEIN_9B = Flux2KleinConfig(
    transformer=TransformerConfig(
        num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288
    ),
    text_encoder=dict(QWEN3_8B),
)

# The base (undistilled) checkpoints: the same shapes, classifier-free guidance as two labels.
KLEIN_BASE_4B = dataclasses.replace(KLEIN_4B, is_distilled=False)
KLEIN_BASE_9B = dataclasses.replace(KLEIN_9B, is_distilled=False)

PRESETS: dict[str, Flux2KleinConfig] = {
    "klein-4b": KLEIN_4B,
    "klein-9b": KLEIN_9B,
    "klein-base-4b": KLEIN_BASE_4B,
    "klein-base-9b": KLEIN_BASE_9B,
}

TINY = Flux2KleinConfig(
    transformer=TransformerConfig(
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=48,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
    ),
    vae=VAEConfig(block_out_channels=(8, 16, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4),
    text_encoder=dict(TINY_QWEN3),
    text_encoder_out_layers=(1, 2, 3),
    max_sequence_length=64,
)


def from_json_dict(cls: type, data: dict[str, Any]) -> Any:
    """A config dataclass from a diffusers config.json dict; unknown keys (`_class_name`,
    `_diffusers_version`, fields we do not read) are ignored, and so is a null where our field
    has a value by default."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in data.items():
        if key in fields and (value is not None or fields[key].default is None):
            values[key] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


def to_json_dict(config: Any) -> dict[str, Any]:
    """The diffusers-shaped config.json dict (tuples as lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()}


def read_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def load_config(model_path: str | Path | None, fallback: Flux2KleinConfig = KLEIN_4B) -> Flux2KleinConfig:
    """The component configs of a diffusers folder (model_index.json, transformer/, vae/,
    text_encoder/, scheduler/); `fallback` without a folder (--random-weights)."""
    if model_path is None:
        return fallback
    root = Path(model_path)
    index = read_json(root / "model_index.json")
    scheduler = fallback.scheduler
    if (root / "scheduler" / "scheduler_config.json").is_file():
        scheduler = from_json_dict(SchedulerConfig, read_json(root / "scheduler" / "scheduler_config.json"))
    return Flux2KleinConfig(
        transformer=from_json_dict(TransformerConfig, read_json(root / "transformer" / "config.json")),
        vae=from_json_dict(VAEConfig, read_json(root / "vae" / "config.json")),
        scheduler=scheduler,
        text_encoder=read_json(root / "text_encoder" / "config.json"),
        text_encoder_out_layers=fallback.text_encoder_out_layers,
        max_sequence_length=fallback.max_sequence_length,
        is_distilled=bool(index.get("is_distilled", False)),
    )
