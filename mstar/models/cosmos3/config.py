"""Cosmos3 configs read from a diffusers folder (no torch: the API process reads limits from here).

    config = Cosmos3Config.from_folder("Cosmos3-Edge")   # transformer/, scheduler/, vae/, model_index.json
    NANO_TRANSFORMER, EDGE_TRANSFORMER                   # the two published backbones
    EDGE_RECIPE                                          # Edge's published sampling recipe

Keys are diffusers' Cosmos3OmniTransformer config keys (0.42.1), so a transformer/config.json drops
in. Where each preset value comes from is noted beside it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from mstar.diffusion.scheduler_config import UniPCConfig
from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG, WanVAEConfig

logger = logging.getLogger("mstar.models.cosmos3")

HIDDEN_ACTS = ("silu", "relu2")
# Config keys that do not change the network we build: training-only knobs, the sound and action
# heads (those modes are refused), and keys newer checkpoints write that diffusers 0.42.1 ignores.
_KEYS_NOT_BUILT = {
    "attention_dropout",
    "dtype",
    "action_dim",
    "num_embodiment_domains",
    "sound_dim",
    "sound_latent_fps",
    "backbone_type",
    "temporal_compression_factor",
    "rope_scaling",  # read for its mrope_section
}


@dataclasses.dataclass(frozen=True)
class Cosmos3TransformerConfig:
    """diffusers Cosmos3OmniTransformer's config; the defaults are diffusers' own, which are Nano's."""

    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"  # "silu": gated MLP, diffusers RMSNorm; "relu2": ReLU^2 MLP, Nemotron norm
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    qk_norm_for_text: bool = True  # q/k RMSNorm on the understanding pathway
    use_und_k_norm_for_gen: bool = False  # an extra norm on understanding keys, for generation only
    rope_theta: float = 5000000.0
    rope_axes_dim: tuple[int, int, int] = (24, 20, 20)  # mRoPE frequencies per (t, h, w)
    vocab_size: int = 151936
    latent_channel: int = 48
    latent_patch_size: int = 2
    patch_latent_dim: int = 192
    timestep_scale: float = 0.001
    base_fps: int = 24
    enable_fps_modulation: bool = True
    unified_3d_mrope_reset_spatial_ids: bool = True
    unified_3d_mrope_temporal_modality_margin: int = 15000
    sound_gen: bool = False
    action_gen: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rope_axes_dim", tuple(int(n) for n in self.rope_axes_dim))
        if self.hidden_act not in HIDDEN_ACTS:
            raise ValueError(f"Cosmos3 hidden_act must be one of {HIDDEN_ACTS}, got {self.hidden_act!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("Cosmos3 num_attention_heads must be a multiple of num_key_value_heads")
        if len(self.rope_axes_dim) != 3 or sum(self.rope_axes_dim) != self.head_dim // 2:
            raise ValueError(f"Cosmos3 rope_axes_dim {self.rope_axes_dim} must sum to head_dim / 2")
        if self.patch_latent_dim != self.latent_patch_size**2 * self.latent_channel:
            raise ValueError("Cosmos3 patch_latent_dim must be latent_patch_size^2 * latent_channel")

    @property
    def nemotron(self) -> bool:
        """ReLU^2 backbones use the Nemotron norm (computed in float32, weight applied in float32)."""
        return self.hidden_act == "relu2"

    @property
    def has_und_k_norm_for_gen(self) -> bool:
        return self.use_und_k_norm_for_gen and not self.qk_norm_for_text

    def to_dict(self) -> dict[str, Any]:
        """diffusers Cosmos3OmniTransformer keyword arguments (random-weight baselines, tests)."""
        values = dataclasses.asdict(self)
        values["rope_axes_dim"] = list(self.rope_axes_dim)
        return values

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Cosmos3TransformerConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key in fields:
                values[key] = value
            elif not key.startswith("_") and key not in _KEYS_NOT_BUILT:
                logger.warning("Cosmos3 transformer config: ignoring unknown key %r", key)
        if raw.get("rope_axes_dim") is None:
            # diffusers: rope_scaling's mrope_section, else (24, 20, 20)
            rope_scaling = raw.get("rope_scaling") or {}
            values["rope_axes_dim"] = tuple(rope_scaling.get("mrope_section", (24, 20, 20)))
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str | Path) -> Cosmos3TransformerConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


NANO_TRANSFORMER = Cosmos3TransformerConfig()
"""Cosmos3-Nano: diffusers' Cosmos3OmniTransformer defaults (documented as nvidia/Cosmos3-Nano)."""

# Cosmos3-Edge. Sources: diffusers' scripts/convert_cosmos3_to_diffusers.py (_build_edge_transformer:
# every value below but the last two); transformers 5.24's Cosmos3EdgeTextConfig defaults (checkpoint
# nvidia/Cosmos3-Edge) agree on the trunk (2048 hidden, 9216 MLP, 28 layers, 16/8 heads of 128,
# relu2, eps 1e-5, theta 1e8, mrope (24, 20, 20), vocab 131072). use_und_k_norm_for_gen: NVIDIA
# cosmos-framework's Edge experiment config, and transformers' Edge loader lists the checkpoint's
# layers.*.self_attn.k_norm_und_for_gen among its generator keys. action_gen: the converter finds
# action weights in the Edge checkpoint (we build no action head; that mode is refused).
EDGE_TRANSFORMER = Cosmos3TransformerConfig(
    hidden_size=2048,
    intermediate_size=9216,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    hidden_act="relu2",
    rms_norm_eps=1e-5,
    qk_norm_for_text=False,
    rope_theta=100000000.0,
    rope_axes_dim=(24, 20, 20),
    vocab_size=131072,
    use_und_k_norm_for_gen=True,
    action_gen=True,
)

# Edge's folder as the converter writes it: UniPC (1000 steps, order 2, bh2, lower_order_final,
# final sigma 0, flow sigmas, flow prediction, flow_shift 5.0) and the pipeline flags below.
EDGE_SCHEDULER = UniPCConfig(flow_shift=5.0)


@dataclasses.dataclass(frozen=True)
class Cosmos3PipelineFlags:
    """Cosmos3OmniPipeline's registered config (model_index.json); defaults are diffusers'."""

    default_use_system_prompt: bool = True
    use_native_flow_schedule: bool = False

    @classmethod
    def from_model_index(cls, raw: dict[str, Any]) -> Cosmos3PipelineFlags:
        return cls(
            default_use_system_prompt=bool(raw.get("default_use_system_prompt", True)),
            use_native_flow_schedule=bool(raw.get("use_native_flow_schedule", False)),
        )


EDGE_PIPELINE_FLAGS = Cosmos3PipelineFlags(default_use_system_prompt=False, use_native_flow_schedule=True)


@dataclasses.dataclass(frozen=True)
class Cosmos3Recipe:
    """Request defaults. Edge's published recipe: 832x480, 121 frames at 24 fps, 20 UniPC steps,
    guidance 6.0, flow shift 12.0 (on the native flow schedule); images 640x640. The recipe names
    one step count, guidance and shift; images use them too."""

    video_width: int = 832
    video_height: int = 480
    num_frames: int = 121
    fps: float = 24.0
    image_width: int = 640
    image_height: int = 640
    num_inference_steps: int = 20
    guidance_scale: float = 6.0
    flow_shift: float | None = 12.0  # None: the folder's scheduler as it is


EDGE_RECIPE = Cosmos3Recipe()


@dataclasses.dataclass(frozen=True)
class Cosmos3Config:
    """Everything a Cosmos3 build reads from its folder, plus the request defaults."""

    transformer: Cosmos3TransformerConfig = EDGE_TRANSFORMER
    scheduler: UniPCConfig = EDGE_SCHEDULER
    vae: WanVAEConfig = WAN22_TI2V_5B_VAE_CONFIG
    pipeline: Cosmos3PipelineFlags = EDGE_PIPELINE_FLAGS
    recipe: Cosmos3Recipe = EDGE_RECIPE

    def __post_init__(self) -> None:
        if self.vae.z_dim != self.transformer.latent_channel:
            raise ValueError(
                f"Cosmos3: the VAE has {self.vae.z_dim} latent channels, the transformer "
                f"{self.transformer.latent_channel}"
            )

    @classmethod
    def from_folder(cls, folder: str | Path, recipe: Cosmos3Recipe = EDGE_RECIPE) -> Cosmos3Config:
        """From a diffusers Cosmos3OmniPipeline folder."""
        root = Path(folder)
        index_path = root / "model_index.json"
        if not index_path.is_file():
            raise ValueError(f"{root} is not a diffusers model folder: no model_index.json")
        model_index = json.loads(index_path.read_text(encoding="utf-8"))
        return cls(
            transformer=Cosmos3TransformerConfig.from_json_file(root / "transformer" / "config.json"),
            scheduler=UniPCConfig.from_json_file(root / "scheduler" / "scheduler_config.json"),
            vae=WanVAEConfig.from_json_file(root / "vae" / "config.json"),
            pipeline=Cosmos3PipelineFlags.from_model_index(model_index),
            recipe=recipe,
        )


def tiny_cosmos3_config(backbone: str = "edge") -> Cosmos3Config:
    """A kilobytes-small Cosmos3 for CPU tests: the Edge-like (or, with "nano", the Nano-like)
    backbone at 2 layers of 64 (4 query and 2 key-value heads of 16), the tiny Wan VAE (16 latent
    channels), that backbone's pipeline flags."""
    from mstar.models.wan22.config import tiny_wan22_config

    if backbone not in ("edge", "nano"):
        raise ValueError(f"tiny Cosmos3: backbone must be 'edge' or 'nano', got {backbone!r}")
    nano = backbone == "nano"
    transformer = dataclasses.replace(
        NANO_TRANSFORMER if nano else EDGE_TRANSFORMER, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_axes_dim=(4, 2, 2), latent_channel=16, patch_latent_dim=64, vocab_size=264,
    )  # fmt: skip
    recipe = Cosmos3Recipe(
        video_width=32, video_height=32, num_frames=5, image_width=32, image_height=32,
        num_inference_steps=3, guidance_scale=6.0, flow_shift=None,
    )  # fmt: skip
    vae = WanVAEConfig.from_dict(tiny_wan22_config().vae)
    return Cosmos3Config(
        transformer=transformer, scheduler=UniPCConfig(flow_shift=3.0), vae=vae,
        pipeline=Cosmos3PipelineFlags() if nano else EDGE_PIPELINE_FLAGS, recipe=recipe,
    )  # fmt: skip
