"""Wan VAE configuration: the fields of diffusers' AutoencoderKLWan vae/config.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

# Wan2.2-TI2V-5B (Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json, as written by diffusers'
# scripts/convert_wan_to_diffusers.py): 4x16x16 compression = patch 2 x three 2x spatial stages.
WAN22_LATENTS_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
    -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
    -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
    -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)  # fmt: skip
WAN22_LATENTS_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
    0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
    0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
    0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)  # fmt: skip
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip

# Keys of real configs that do not change the network in the diffusers version we match.
_IGNORED_KEYS = {"clip_output"}


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """AutoencoderKLWan's constructor arguments; defaults are diffusers' (the Wan 2.1 VAE)."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # sic: diffusers' spelling
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int = 4
    scale_factor_spatial: int = 8

    def __post_init__(self) -> None:
        if self.attn_scales:
            raise ValueError("attn_scales must be empty (diffusers' Wan VAE cannot run encoder attention)")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise ValueError("temperal_downsample needs one entry per downsampling stage")

    @property
    def decoder_dim(self) -> int:
        return self.base_dim if self.decoder_base_dim is None else self.decoder_base_dim

    @property
    def patch(self) -> int:
        return 1 if self.patch_size is None else self.patch_size

    @property
    def temporal_upsample(self) -> tuple[bool, ...]:
        return tuple(reversed(self.temperal_downsample))

    def num_latent_frames(self, num_frames: int) -> int:
        """Latent frames of a 1 + 4k frame video: the first frame alone, then 4 per latent frame."""
        return (num_frames - 1) // self.scale_factor_temporal + 1

    def latent_shape(self, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """[z, F', H', W'] latents of a video (or image, num_frames 1) of this size."""
        spatial = self.scale_factor_spatial
        return (self.z_dim, self.num_latent_frames(num_frames), height // spatial, width // spatial)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WanVAEConfig:
        """From a diffusers config dict; `_`-prefixed metadata is skipped, unknown keys rejected."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key.startswith("_") or key in _IGNORED_KEYS:
                continue
            if key not in fields:
                raise ValueError(f"unknown Wan VAE config key '{key}'")
            values[key] = tuple(value) if isinstance(value, list) else value
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str | Path) -> WanVAEConfig:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


WAN22_TI2V_5B_VAE_CONFIG = WanVAEConfig(
    base_dim=160,
    decoder_base_dim=256,
    z_dim=48,
    dim_mult=(1, 2, 4, 4),
    num_res_blocks=2,
    temperal_downsample=(False, True, True),
    latents_mean=WAN22_LATENTS_MEAN,
    latents_std=WAN22_LATENTS_STD,
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_temporal=4,
    scale_factor_spatial=16,
)
