"""Building the LTX-2 components on a device: from a diffusers folder (transformer/, connectors/,
vae/, audio_vae/, vocoder/, text_encoder/, tokenizer/, scheduler/) with diffusers' key names, or
with seeded random weights of the real shapes (mstar.models.checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from mstar.models.checkpoint import build_module, component_path, read_config
from mstar.models.ltx2.config import (
    AudioVAEConfig,
    ConnectorsConfig,
    DiTConfig,
    LTX2Config,
    SchedulerConfig,
    VideoVAEConfig,
    VocoderConfig,
    from_json_dict,
)

Progress = Callable[[str, int, int], None] | None


def load_configs(model_path: str | None, fallback: LTX2Config) -> LTX2Config:
    """Component configs from the folder's config.json files (the fallback without a folder)."""
    if model_path is None:
        return fallback

    def read(component: str, cls: type, name: str = "config.json"):
        return from_json_dict(cls, read_config(component_path(model_path, component), name))

    scheduler = fallback.scheduler
    if (Path(model_path) / "scheduler").is_dir():
        scheduler = read("scheduler", SchedulerConfig, "scheduler_config.json")
    return replace(
        fallback,
        dit=read("transformer", DiTConfig),
        connectors=read("connectors", ConnectorsConfig),
        vae=read("vae", VideoVAEConfig),
        audio_vae=read("audio_vae", AudioVAEConfig),
        vocoder=read("vocoder", VocoderConfig),
        scheduler=scheduler,
        text_encoder=read_config(component_path(model_path, "text_encoder")),
    )


def _folder(model_path: str | None, component: str) -> Path | None:
    return None if model_path is None else component_path(model_path, component)


def build_dit(
    config: DiTConfig, device, dtype, model_path: str | None = None, seed: int = 0, progress: Progress = None
):
    from mstar.models.ltx2.dit import LTX2DiT

    folder = _folder(model_path, "transformer")
    return build_module(lambda: LTX2DiT(config), device, dtype, folder, seed, progress=progress)


def build_connectors(
    config: ConnectorsConfig,
    device,
    dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Progress = None,
):
    from mstar.models.ltx2.connectors import LTX2TextConnectors

    folder = _folder(model_path, "connectors")
    return build_module(lambda: LTX2TextConnectors(config), device, dtype, folder, seed, progress=progress)


def _neutral_statistics(module: torch.nn.Module) -> None:
    """Random weights: latent statistics of 0 and 1 (random ones could divide by nearly zero)."""
    with torch.no_grad():
        module.latents_mean.zero_()
        module.latents_std.fill_(1.0)


def build_video_vae(
    config: VideoVAEConfig,
    device,
    dtype,
    model_path: str | None = None,
    seed: int = 0,
    encoder: bool = True,
    decoder: bool = True,
    progress: Progress = None,
):
    """The video VAE, or only its encoder or decoder (the folder's other half is not read)."""
    from mstar.models.ltx2.video_vae import LTX2VideoVAE

    skipped = () if encoder else ("encoder.",)
    skipped += () if decoder else ("decoder.",)
    folder = _folder(model_path, "vae")
    vae = build_module(
        lambda: LTX2VideoVAE(config, encoder=encoder, decoder=decoder), device, dtype, folder, seed,
        progress=progress, ignore_unexpected=skipped,
    )  # fmt: skip
    if folder is None:
        _neutral_statistics(vae)
    return vae


def build_audio_decoder(
    config: AudioVAEConfig,
    device,
    dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Progress = None,
):
    """The audio VAE's decoder (its encoder, in the same folder, is not read)."""
    from mstar.models.ltx2.audio_vae import LTX2AudioDecoder

    folder = _folder(model_path, "audio_vae")
    decoder = build_module(
        lambda: LTX2AudioDecoder(config),
        device,
        dtype,
        folder,
        seed,
        progress=progress,
        ignore_unexpected=("encoder.",),
    )
    if folder is None:
        _neutral_statistics(decoder)
    return decoder


def build_vocoder(
    config: VocoderConfig,
    device,
    dtype,
    model_path: str | None = None,
    seed: int = 0,
    progress: Progress = None,
):
    from mstar.models.ltx2.vocoder import LTX2Vocoder

    folder = _folder(model_path, "vocoder")
    return build_module(lambda: LTX2Vocoder(config), device, dtype, folder, seed, progress=progress)


def load_tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(component_path(model_path, "tokenizer")))
