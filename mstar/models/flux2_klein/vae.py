"""AutoencoderKLFlux2 as the klein pipeline uses it, with diffusers' state-dict keys: the decoder
(`decoder.*`, `post_quant_conv.*`) for outputs, the encoder (`encoder.*`, `quant_conv.*`) for
reference images, and the latent batch-norm statistics (`bn.running_mean/var`) both use.

The transformer's latents are the VAE's 32-channel latents patchified 2x2 into 128 channels and
normalised by the batch-norm statistics (per patchified channel):
    encode: image -> encoder -> quant_conv -> mean half -> patchify -> (z - mean) / sqrt(var + eps)
    decode: z * sqrt(var + eps) + mean -> unpatchify -> post_quant_conv -> decoder -> image
The resnet, attention, mid and up blocks are the AutoencoderKL ones Z-Image's decoder uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.flux2_klein.config import VAEConfig
from mstar.models.zimage.vae import RESNET_EPS, Decoder, GroupNorm, MidBlock, ResnetBlock

ENCODER_PATTERNS = ("encoder.", "quant_conv.")
DECODER_PATTERNS = ("decoder.", "post_quant_conv.")
# nn.BatchNorm2d's step counter: the checkpoint has it, the latent normalisation never reads it.
UNREAD_PATTERNS = ("bn.num_batches_tracked",)


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, H, W] -> [B, 4C, H/2, W/2], channel-major with the 2x2 offsets inside (the pipeline's)."""
    batch, channels, height, width = latents.shape
    patches = latents.view(batch, channels, height // 2, 2, width // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return patches.reshape(batch, channels * 4, height // 2, width // 2)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w] (inverse of patchify)."""
    batch, channels, height, width = latents.shape
    cells = latents.reshape(batch, channels // 4, 2, 2, height, width).permute(0, 1, 4, 2, 5, 3)
    return cells.reshape(batch, channels // 4, height * 2, width * 2)


class LatentNorm(nn.Module):
    """The checkpoint's `bn` running statistics over patchified channels (affine-free batch norm,
    always in eval form). Kept in fp32 (see VAE_FP32_PATTERNS)."""

    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(self.running_var.view(1, -1, 1, 1) + self.eps).to(like.device, like.dtype)
        return mean, std

    def normalize(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return (latents - mean) / std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return latents * std + mean


VAE_FP32_PATTERNS = ("bn.",)


class Downsample(nn.Module):
    """Stride-2 3x3 conv after padding right and bottom by one (diffusers' Downsample2D, padding 0)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0))


class DownBlock(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, num_layers: int, groups: int, add_downsample: bool
    ):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock(in_channels if i == 0 else out_channels, out_channels, groups)
            for i in range(num_layers)
        )
        self.downsamplers = nn.ModuleList([Downsample(out_channels)]) if add_downsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
        return x


class Encoder(nn.Module):
    """diffusers' vae.Encoder with double_z: image -> 2 x latent_channels (mean, log-variance)."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        channels, groups = config.block_out_channels, config.norm_num_groups
        self.conv_in = nn.Conv2d(config.in_channels, channels[0], 3, padding=1)
        self.down_blocks = nn.ModuleList()
        previous = channels[0]
        for index, out in enumerate(channels):
            is_last = index == len(channels) - 1
            self.down_blocks.append(DownBlock(previous, out, config.layers_per_block, groups, not is_last))
            previous = out
        self.mid_block = MidBlock(channels[-1], groups, config.mid_block_add_attention)
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=RESNET_EPS)
        self.conv_out = nn.Conv2d(channels[-1], 2 * config.latent_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(self.mid_block(x))))


class VAEDecoder(nn.Module):
    """Transformer latents -> images. Keys `decoder.*`, `post_quant_conv.*`, `bn.*`."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.decoder = Decoder(config)
        channels = config.latent_channels
        self.post_quant_conv = nn.Conv2d(channels, channels, 1) if config.use_post_quant_conv else None
        self.bn = LatentNorm(config.patchified_channels, config.batch_norm_eps)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, 128, h, w] as the transformer's grid (normalised, patchified) -> images
        [B, 3, 16h, 16w] in [-1, 1] (unclamped), in the decoder's dtype."""
        z = unpatchify(self.bn.denormalize(latents.float()))
        z = z.to(self.decoder.conv_in.weight.dtype)
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def decode_frames(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [128, h, w] -> uint8 [1, H, W, 3] on the same device, as the pipeline's
        postprocess (round(clamp(x / 2 + 0.5, 0, 1) * 255))."""
        image = self.decode(latents.unsqueeze(0)).float()
        image = (image / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class VAEEncoder(nn.Module):
    """Reference images -> transformer latents. Keys `encoder.*`, `quant_conv.*`, `bn.*`."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        channels = 2 * config.latent_channels
        self.quant_conv = nn.Conv2d(channels, channels, 1) if config.use_quant_conv else None
        self.bn = LatentNorm(config.patchified_channels, config.batch_norm_eps)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, H, W] in [-1, 1] (H, W multiples of 16) -> latents [B, 128, H/16, W/16],
        the posterior's mode (the pipeline's sample_mode="argmax"), patchified and normalised, fp32."""
        moments = self.encoder(images.to(self.encoder.conv_in.weight.dtype))
        if self.quant_conv is not None:
            moments = self.quant_conv(moments)
        mean = moments[:, : self.config.latent_channels]
        return self.bn.normalize(patchify(mean).float())


def vae_ignore_patterns(part: str) -> tuple[str, ...]:
    """What a decoder ("decoder") or encoder ("encoder") build skips in the full vae/ folder."""
    skipped = ENCODER_PATTERNS if part == "decoder" else DECODER_PATTERNS
    return skipped + UNREAD_PATTERNS
