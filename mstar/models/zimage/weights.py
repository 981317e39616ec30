"""Building the Z-Image components on a device: from a diffusers folder (transformer/, vae/,
text_encoder/) or with seeded random weights of the real shapes (mstar.models.checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from mstar.models.checkpoint import build_module, component_path, read_config
from mstar.models.zimage.config import DiTConfig, SchedulerConfig, VAEConfig, ZImageConfig, from_json_dict

# The VAE folder also holds the encoder half, which serving never runs.
VAE_ENCODER_PATTERNS = ("encoder.", "quant_conv.")


def load_configs(model_path: str | None, fallback: ZImageConfig) -> ZImageConfig:
    """Component configs from the folder's config.json files (the fallback without a folder)."""
    if model_path is None:
        return fallback
    dit = from_json_dict(DiTConfig, read_config(component_path(model_path, "transformer")))
    vae = from_json_dict(VAEConfig, read_config(component_path(model_path, "vae")))
    text = read_config(component_path(model_path, "text_encoder"))
    scheduler = fallback.scheduler
    if (Path(model_path) / "scheduler").is_dir():
        scheduler_json = read_config(component_path(model_path, "scheduler"), "scheduler_config.json")
        scheduler = from_json_dict(SchedulerConfig, scheduler_json)
    return ZImageConfig(dit=dit, vae=vae, scheduler=scheduler, text_encoder=text)


def _folder(model_path: str | None, component: str) -> Path | None:
    return None if model_path is None else component_path(model_path, component)


def build_dit(
    config: DiTConfig,
    device: str,
    dtype: torch.dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
):
    from mstar.models.zimage.dit import ZImageDiT

    folder = _folder(model_path, "transformer")
    return build_module(lambda: ZImageDiT(config), device, dtype, folder, seed, progress=progress)


def build_vae_decoder(
    config: VAEConfig,
    device: str,
    dtype: torch.dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
):
    from mstar.models.zimage.vae import VAEDecoder

    folder = _folder(model_path, "vae")
    return build_module(
        lambda: VAEDecoder(config), device, dtype, folder, seed,
        progress=progress, ignore_unexpected=VAE_ENCODER_PATTERNS,
    )  # fmt: skip
