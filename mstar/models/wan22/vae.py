"""The Wan VAE (Wan2.2-TI2V-5B's 4x16x16 one, and Wan 2.1's 4x8x8), plain PyTorch.

State-dict keys equal diffusers' AutoencoderKLWan, so a diffusers `vae/` folder loads directly.
Decoding runs one latent frame at a time with causal frame caches exactly as diffusers does
(frame 0 -> 1 video frame, every later latent frame -> 4), so outputs match diffusers.

    vae = load_wan_vae("ckpt/vae", device="cuda", dtype=torch.bfloat16)
    video = vae.decode(denormalize_latents(latents, vae.config))   # [B, 3, F, H, W] in [-1, 1]
    mean = vae.encode(image)                                        # [B, 3, 1, H, W] -> [B, z, 1, h, w]
    decoder = decoder_only(vae); del vae                            # serving keeps only this
    decoder = load_wan_vae("ckpt/vae", "cuda", torch.bfloat16, decoder_only=True)  # reads no encoder
    encoder = load_wan_vae("ckpt/vae", "cuda", torch.bfloat16, encoder_only=True)  # reads no decoder

For serving decode (channels_last_3d, torch.compile, uint8 frames) see mstar.diffusion.vae_decode.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from mstar.models.wan22.vae_blocks import CausalConv3d, FrameCache
from mstar.models.wan22.vae_coders import Decoder3d, Encoder3d, patchify, unpatchify
from mstar.models.wan22.vae_config import WanVAEConfig

ENCODE_CHUNK_FRAMES = 4  # frames per encoder call after the first frame (diffusers hard-codes 4)
_ENCODER_KEY_PREFIXES = ("encoder.", "quant_conv.")  # skipped by the decoder-only copy
_DECODER_KEY_PREFIXES = ("decoder.", "post_quant_conv.")  # skipped by the encoder-only copy


def _build_decoder(config: WanVAEConfig) -> Decoder3d:
    return Decoder3d(
        dim=config.decoder_dim,
        z_dim=config.z_dim,
        dim_mult=config.dim_mult,
        num_res_blocks=config.num_res_blocks,
        temporal_upsample=config.temporal_upsample,
        out_channels=config.out_channels,
        is_residual=config.is_residual,
    )


def _build_encoder(config: WanVAEConfig) -> Encoder3d:
    return Encoder3d(
        in_channels=config.in_channels,
        dim=config.base_dim,
        z_dim=config.z_dim * 2,  # mean and log-variance
        dim_mult=config.dim_mult,
        num_res_blocks=config.num_res_blocks,
        temporal_downsample=config.temperal_downsample,
        is_residual=config.is_residual,
    )


class _LatentDecoding:
    """Decode methods shared by the full VAE and the decoder-only serving copy."""

    config: WanVAEConfig
    post_quant_conv: CausalConv3d
    decoder: Decoder3d

    def decode_chunk(
        self, x: torch.Tensor, previous_tails: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Latent frames after post_quant_conv, x [B, z, n, h, w] -> (frames, tails).

        frames: [B, out_channels, f, h*s/p, w*s/p], still patchified. The first chunk
        (previous_tails None) must be the single first latent frame and gives f = 1; later chunks
        give f = 4n. Pass the returned tails to the next chunk.
        """
        cache = FrameCache(previous_tails)
        frames = self.decoder(x, cache)
        return frames, cache.tails

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-normalised latents [B, z, F', H', W'] -> video [B, 3, 1 + 4(F'-1), H, W] in [-1, 1]."""
        self._check_latents(latents)
        x = self.post_quant_conv(latents)
        tails = None
        chunks = []
        for index in range(x.shape[2]):
            frames, tails = self.decode_chunk(x[:, :, index : index + 1], tails)
            chunks.append(frames)
        return self.to_video(torch.cat(chunks, dim=2)).clamp(-1.0, 1.0)

    def to_video(self, frames: torch.Tensor) -> torch.Tensor:
        """Decoder output [B, out_channels, F, h, w] -> unclamped video [B, 3, F, h*p, w*p]."""
        return unpatchify(frames, self.config.patch)

    def _check_latents(self, latents: torch.Tensor) -> None:
        if latents.dim() != 5 or latents.shape[1] != self.config.z_dim:
            raise ValueError(f"latents must be [B, {self.config.z_dim}, F, H, W], got {tuple(latents.shape)}")


class _VideoEncoding:
    """The encode method shared by the full VAE and the encoder-only serving copy."""

    config: WanVAEConfig
    encoder: Encoder3d
    quant_conv: CausalConv3d

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video [B, 3, 1 + 4k, H, W] in [-1, 1] -> latent mean [B, z, 1 + k, H/s, W/s] (un-normalised).

        For image-to-video pass the first frame alone ([B, 3, 1, H, W]).
        """
        num_frames = video.shape[2]
        if video.dim() != 5 or (num_frames - 1) % ENCODE_CHUNK_FRAMES != 0:
            raise ValueError(f"video must be [B, C, 1 + 4k, H, W], got {tuple(video.shape)}")
        x = patchify(video, self.config.patch)
        tails = None
        chunks = []
        for start in [0, *range(1, num_frames, ENCODE_CHUNK_FRAMES)]:
            stop = 1 if start == 0 else start + ENCODE_CHUNK_FRAMES
            cache = FrameCache(tails)
            chunks.append(self.encoder(x[:, :, start:stop], cache))
            tails = cache.tails
        moments = self.quant_conv(torch.cat(chunks, dim=2))  # [B, 2z, F', H', W']: mean, log-variance
        return moments[:, : self.config.z_dim]


class WanVAE(_VideoEncoding, _LatentDecoding, nn.Module):
    """Encoder + decoder with diffusers AutoencoderKLWan's state-dict keys."""

    def __init__(self, config: WanVAEConfig):
        super().__init__()
        self.config = config
        self.encoder = _build_encoder(config)
        self.quant_conv = CausalConv3d(config.z_dim * 2, config.z_dim * 2, 1)
        self.post_quant_conv = CausalConv3d(config.z_dim, config.z_dim, 1)
        self.decoder = _build_decoder(config)


class WanVAEEncoder(_VideoEncoding, nn.Module):
    """Serving copy for image-to-video: encoder + quant_conv only (same keys as in the full VAE,
    in the same order, so seeded random weights equal the full VAE's). The decoder it leaves out
    is 555M parameters (1.03 GiB in bf16) for Wan2.2-TI2V-5B; the decode node has its own."""

    def __init__(self, config: WanVAEConfig):
        super().__init__()
        self.config = config
        self.encoder = _build_encoder(config)
        self.quant_conv = CausalConv3d(config.z_dim * 2, config.z_dim * 2, 1)


class WanVAEDecoder(_LatentDecoding, nn.Module):
    """Serving copy: post_quant_conv + decoder only (same keys as in the full VAE)."""

    def __init__(self, config: WanVAEConfig, post_quant_conv: CausalConv3d | None = None, decoder=None):
        super().__init__()
        self.config = config
        if post_quant_conv is None:
            post_quant_conv = CausalConv3d(config.z_dim, config.z_dim, 1)
        self.post_quant_conv = post_quant_conv
        self.decoder = decoder if decoder is not None else _build_decoder(config)


def decoder_only(vae: WanVAE) -> WanVAEDecoder:
    """The decoder half of `vae`, sharing its modules; drop `vae` to free the encoder."""
    return WanVAEDecoder(vae.config, vae.post_quant_conv, vae.decoder)


def _latent_stats(config: WanVAEConfig, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if len(config.latents_mean) != config.z_dim or len(config.latents_std) != config.z_dim:
        raise ValueError(f"latents_mean/latents_std need {config.z_dim} entries")
    shape = (1, config.z_dim, 1, 1, 1)
    mean = torch.tensor(config.latents_mean).view(shape).to(like.device, like.dtype)
    recip_std = 1.0 / torch.tensor(config.latents_std).view(shape).to(like.device, like.dtype)
    return mean, recip_std


def denormalize_latents(latents: torch.Tensor, config: WanVAEConfig) -> torch.Tensor:
    """Diffusion-space latents -> VAE latents (the decode input), with diffusers' exact arithmetic."""
    mean, recip_std = _latent_stats(config, latents)
    return latents / recip_std + mean


def normalize_latents(latents: torch.Tensor, config: WanVAEConfig) -> torch.Tensor:
    """VAE latents (the encode output) -> diffusion-space latents, as diffusers' I2V pipeline."""
    mean, recip_std = _latent_stats(config, latents)
    return (latents - mean) * recip_std


def load_wan_vae(
    vae_dir: str | Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    decoder_only: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    encoder_only: bool = False,
) -> WanVAE | WanVAEDecoder | WanVAEEncoder:
    """Build from a diffusers `vae/` folder (config.json + safetensors) straight onto device/dtype.

    decoder_only=True reads just the post_quant_conv and decoder tensors (the serving copy);
    encoder_only=True just the encoder and quant_conv tensors (image-to-video's encode node).
    Errors (mstar.models.checkpoint.CheckpointError, a ValueError) name the offending tensor.
    """
    from mstar.models.checkpoint import build_module, read_config

    config = WanVAEConfig.from_dict(read_config(vae_dir))
    if decoder_only and encoder_only:
        raise ValueError("load_wan_vae: decoder_only and encoder_only exclude each other")
    if encoder_only:
        return build_module(
            lambda: WanVAEEncoder(config), device, dtype, folder=vae_dir, progress=progress,
            ignore_unexpected=_DECODER_KEY_PREFIXES,
        )  # fmt: skip
    if decoder_only:
        return build_module(
            lambda: WanVAEDecoder(config), device, dtype, folder=vae_dir, progress=progress,
            ignore_unexpected=_ENCODER_KEY_PREFIXES,
        )  # fmt: skip
    return build_module(lambda: WanVAE(config), device, dtype, folder=vae_dir, progress=progress)
