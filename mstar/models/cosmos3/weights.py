"""Cosmos3 parts from a diffusers folder (or seeded random weights of the same shapes).

    transformer = load_transformer(folder, "cuda", torch.bfloat16)   # transformer/ safetensors
    transformer = load_transformer(None, "cuda", torch.bfloat16, config=config)   # --random-weights
    encoder = load_vae(folder, "cuda", torch.bfloat16, part="encoder")   # image-to-video's encode
    decoder = load_vae(folder, "cuda", torch.bfloat16, part="decoder")

The VAE is Wan2.2's z48 one (mstar.models.wan22.vae, the same diffusers AutoencoderKLWan keys).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from mstar.models.checkpoint import build_module
from mstar.models.cosmos3.config import Cosmos3Config
from mstar.models.cosmos3.transformer import Cosmos3Transformer
from mstar.models.wan22.vae import load_wan_vae


def load_transformer(
    folder: str | Path | None,
    device: str | torch.device,
    dtype: torch.dtype,
    *,
    config: Cosmos3Config | None = None,
    seed: int = 0,
    progress: Callable[[str, int, int], None] | None = None,
) -> Cosmos3Transformer:
    """From `folder`/transformer (diffusers' keys; the reasoner-only and sound/action tensors are
    skipped), or with seeded random weights when folder is None (then `config` is required)."""
    if config is None:
        if folder is None:
            raise ValueError("load_transformer: random weights need a config")
        config = Cosmos3Config.from_folder(folder)
    weights = None if folder is None else Path(folder) / "transformer"
    return build_module(
        lambda: Cosmos3Transformer(config.transformer, config.vae.scale_factor_temporal),
        device,
        dtype,
        folder=weights,
        seed=seed,
        keep_fp32=Cosmos3Transformer.fp32_param_patterns,
        progress=progress,
        ignore_unexpected=Cosmos3Transformer.unused_checkpoint_patterns,
    )


def load_vae(
    folder: str | Path,
    device: str | torch.device,
    dtype: torch.dtype,
    part: Literal["encoder", "decoder", "both"] = "both",
    progress: Callable[[str, int, int], None] | None = None,
):
    """The folder's Wan VAE: its encoder half, decoder half, or both."""
    return load_wan_vae(
        Path(folder) / "vae",
        device,
        dtype,
        decoder_only=part == "decoder",
        encoder_only=part == "encoder",
        progress=progress,
    )
