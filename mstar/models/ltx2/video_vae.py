"""The LTX-2 video VAE (diffusers AutoencoderKLLTX2Video, same state-dict keys), plain PyTorch, with
the latent normalisation LTX2Pipeline applies around it.

    vae = LTX2VideoVAE(VideoVAEConfig(...))              # load with mstar.models.checkpoint
    video = vae.decode(vae.denormalize(latents))          # [B, C, F', H', W'] -> [B, 3, F, H, W] in [-1, 1]
    latents = vae.normalize(vae.encode(image[:, :, None]))  # image-to-video's first frame (the mean)

decode() and encode() take whole clips (the pipeline's defaults: no tiling, no frame batches): the
decoder is not causal in time, so a clip cannot be split into independent frame chunks.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.models.ltx2.config import VideoVAEConfig, from_json_dict
from mstar.models.ltx2.video_vae_blocks import (
    CausalConv3d,
    DownBlock3d,
    MidBlock3d,
    TimeConditioning,
    UpBlock3d,
    per_channel_rms_norm,
)


def _check_supported(config: VideoVAEConfig) -> None:
    if any(config.decoder_inject_noise):
        raise ValueError(
            "video VAE: decoder_inject_noise is not supported (diffusers draws unseeded noise there)"
        )
    if any(kind != "LTX2VideoDownBlock3D" for kind in config.down_block_types):
        raise ValueError(f"video VAE: unknown down block types {config.down_block_types}")


class Encoder3d(nn.Module):
    """diffusers LTX2VideoEncoder3d: patchify, conv_in, down blocks, mid block, conv_out."""

    def __init__(self, config: VideoVAEConfig):
        super().__init__()
        c = config
        self.patch_size, self.patch_size_t = c.patch_size, c.patch_size_t
        self.is_causal = c.encoder_causal
        mode, eps = c.encoder_spatial_padding_mode, c.resnet_norm_eps
        self.conv_in = CausalConv3d(c.in_channels * c.patch_size**2, c.latent_channels, 3, padding_mode=mode)
        channels = c.latent_channels
        blocks = []
        for index, out_channels in enumerate(c.block_out_channels):
            blocks.append(
                DownBlock3d(
                    channels,
                    out_channels,
                    c.layers_per_block[index],
                    eps,
                    c.spatio_temporal_scaling[index],
                    c.downsample_type[index],
                    mode,
                )  # fmt: skip
            )
            channels = out_channels
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = MidBlock3d(channels, c.layers_per_block[-1], eps, False, mode)
        self.conv_out = CausalConv3d(channels, c.latent_channels + 1, 3, padding_mode=mode)

    def forward(self, x: torch.Tensor, causal: bool | None = None) -> torch.Tensor:
        """[B, 3, F, H, W] in [-1, 1] -> [B, 2 * latent_channels, F', H', W'] (mean, log-variance)."""
        p, p_t = self.patch_size, self.patch_size_t
        batch, channels, frames, height, width = x.shape
        causal = causal or self.is_causal
        x = x.reshape(batch, channels, frames // p_t, p_t, height // p, p, width // p, p)
        x = x.permute(0, 1, 3, 7, 5, 2, 4, 6).flatten(1, 4)  # channel, time, width, height offsets
        x = self.conv_in(x, causal=causal)
        for block in self.down_blocks:
            x = block(x, causal=causal)
        x = self.mid_block(x, None, causal=causal)
        x = self.conv_out(torch.nn.functional.silu(per_channel_rms_norm(x)), causal=causal)
        # One log-variance channel, repeated for every latent channel.
        return torch.cat([x, x[:, -1:].repeat(1, x.shape[1] - 2, 1, 1, 1)], dim=1)


class Decoder3d(nn.Module):
    """diffusers LTX2VideoDecoder3d: conv_in, mid block, up blocks, conv_out, unpatchify."""

    def __init__(self, config: VideoVAEConfig):
        super().__init__()
        c = config
        self.patch_size, self.patch_size_t = c.patch_size, c.patch_size_t
        self.is_causal = c.decoder_causal
        mode, eps, tc = c.decoder_spatial_padding_mode, c.resnet_norm_eps, c.timestep_conditioning
        block_channels = tuple(reversed(c.decoder_block_out_channels))
        scaling = tuple(reversed(c.decoder_spatio_temporal_scaling))
        layers = tuple(reversed(c.decoder_layers_per_block))
        residual = tuple(reversed(c.upsample_residual))
        factors = tuple(reversed(c.upsample_factor))
        channels = block_channels[0]
        self.conv_in = CausalConv3d(c.latent_channels, channels, 3, padding_mode=mode)
        self.mid_block = MidBlock3d(channels, layers[0], eps, tc, mode)
        blocks = []
        for index, out_channels in enumerate(block_channels):
            block_in, channels = channels // factors[index], out_channels // factors[index]
            blocks.append(
                UpBlock3d(
                    block_in,
                    channels,
                    layers[index + 1],
                    eps,
                    scaling[index],
                    c.upsample_type[index],
                    tc,
                    residual[index],
                    factors[index],
                    mode,
                )  # fmt: skip
            )
        self.up_blocks = nn.ModuleList(blocks)
        self.conv_out = CausalConv3d(channels, c.out_channels * c.patch_size**2, 3, padding_mode=mode)
        self.timestep_scale_multiplier = None
        if tc:
            self.timestep_scale_multiplier = nn.Parameter(torch.tensor(1000.0, dtype=torch.float32))
            self.time_embedder = TimeConditioning(channels * 2)
            self.scale_shift_table = nn.Parameter(torch.randn(2, channels) / channels**0.5)

    def forward(
        self, z: torch.Tensor, temb: torch.Tensor | None = None, causal: bool | None = None
    ) -> torch.Tensor:
        causal = causal or self.is_causal
        x = self.conv_in(z, causal=causal)
        if self.timestep_scale_multiplier is not None:
            temb = temb * self.timestep_scale_multiplier
        x = self.mid_block(x, temb, causal=causal)
        for block in self.up_blocks:
            x = block(x, temb, causal=causal)
        x = per_channel_rms_norm(x)
        if self.timestep_scale_multiplier is not None:
            t = self.time_embedder(temb, x.dtype).view(x.shape[0], -1, 1, 1, 1).unflatten(1, (2, -1))
            shift, scale = (t + self.scale_shift_table[None, ..., None, None, None]).unbind(dim=1)
            x = x * (1 + scale) + shift
        x = self.conv_out(torch.nn.functional.silu(x), causal=causal)
        p, p_t = self.patch_size, self.patch_size_t
        batch, _, frames, height, width = x.shape
        x = x.reshape(batch, -1, p_t, p, p, frames, height, width)
        return x.permute(0, 1, 5, 2, 6, 4, 7, 3).flatten(6, 7).flatten(4, 5).flatten(2, 3)


class LTX2VideoVAE(nn.Module):
    """Encoder, decoder and the latent statistics (buffers `latents_mean`, `latents_std`)."""

    def __init__(self, config: VideoVAEConfig, encoder: bool = True, decoder: bool = True):
        super().__init__()
        _check_supported(config)
        self.config = config
        self.encoder = Encoder3d(config) if encoder else None
        self.decoder = Decoder3d(config) if decoder else None
        self.register_buffer("latents_mean", torch.zeros(config.latent_channels))
        self.register_buffer("latents_std", torch.ones(config.latent_channels))

    @classmethod
    def from_config(cls, config: VideoVAEConfig | dict, **parts: bool) -> LTX2VideoVAE:
        if isinstance(config, dict):
            config = from_json_dict(VideoVAEConfig, config)
        return cls(config, **parts)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _stats(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        mean = self.latents_mean.view(shape).to(latents.device, latents.dtype)
        std = self.latents_std.view(shape).to(latents.device, latents.dtype)
        return mean, std

    def normalize(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE latents -> the DiT's (LTX2ImageToVideoPipeline._normalize_latents, scaling_factor 1)."""
        mean, std = self._stats(latents)
        return (latents - mean) * 1.0 / std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """The DiT's latents -> the decoder's (LTX2Pipeline._denormalize_latents)."""
        mean, std = self._stats(latents)
        return latents * std / self.config.scaling_factor + mean

    def decode(self, latents: torch.Tensor, timestep: torch.Tensor | None = None) -> torch.Tensor:
        """Denormalised latents [B, C, F', H', W'] -> video [B, 3, F, H, W] (about [-1, 1]).
        timestep [B]: the decode timestep of a timestep-conditioned decoder (else ignored)."""
        if self.decoder is None:
            raise ValueError("this video VAE was built without its decoder")
        if not self.config.timestep_conditioning:
            timestep = None
        elif timestep is None:
            raise ValueError("a timestep-conditioned decoder needs the decode timestep")
        return self.decoder(latents.to(self.dtype), timestep)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """Video [B, 3, F, H, W] in [-1, 1] -> the posterior mean [B, C, F', H', W'] (the pipeline's
        "argmax" sample)."""
        if self.encoder is None:
            raise ValueError("this video VAE was built without its encoder")
        moments = self.encoder(video.to(self.dtype))
        return moments[:, : self.config.latent_channels]
