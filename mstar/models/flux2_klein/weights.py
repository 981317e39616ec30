"""Building the FLUX.2 [klein] components on a device, from a diffusers folder (transformer/,
vae/) or with seeded random weights of the same shapes (mstar.models.checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from mstar.models.checkpoint import build_module, component_path
from mstar.models.flux2_klein.config import TransformerConfig, VAEConfig

Progress = Callable[[str, int, int], None] | None


def _folder(model_path: str | None, component: str) -> Path | None:
    return None if model_path is None else component_path(model_path, component)


def build_dit(
    config: TransformerConfig,
    device: str,
    dtype: torch.dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Progress = None,
):
    from mstar.models.flux2_klein.dit import Flux2DiT

    folder = _folder(model_path, "transformer")
    return build_module(lambda: Flux2DiT(config), device, dtype, folder, seed, progress=progress)


def _build_vae_part(make, part: str, device, dtype, model_path, seed, progress):
    from mstar.models.flux2_klein.vae import VAE_FP32_PATTERNS, vae_ignore_patterns

    folder = _folder(model_path, "vae")
    module = build_module(
        make, device, dtype, folder, seed, keep_fp32=VAE_FP32_PATTERNS, progress=progress,
        ignore_unexpected=vae_ignore_patterns(part),
    )  # fmt: skip
    if folder is None:  # random weights: identity statistics (random ones could be negative variances)
        with torch.no_grad():
            module.bn.running_mean.zero_()
            module.bn.running_var.fill_(1.0)
    return module


def build_vae_decoder(
    config: VAEConfig, device: str, dtype: torch.dtype, model_path: str | None = None, seed: int = 0,
    progress: Progress = None,
):  # fmt: skip
    from mstar.models.flux2_klein.vae import VAEDecoder

    return _build_vae_part(lambda: VAEDecoder(config), "decoder", device, dtype, model_path, seed, progress)


def build_vae_encoder(
    config: VAEConfig, device: str, dtype: torch.dtype, model_path: str | None = None, seed: int = 0,
    progress: Progress = None,
):  # fmt: skip
    from mstar.models.flux2_klein.vae import VAEEncoder

    return _build_vae_part(lambda: VAEEncoder(config), "encoder", device, dtype, model_path, seed, progress)
