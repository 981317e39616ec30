"""The AutoencoderKL decoder (Flux-style VAE, 16 latent channels) with diffusers' state-dict keys
(`decoder.*`, `post_quant_conv.*` when the config uses it); the encoder is not built."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.zimage.config import VAEConfig

RESNET_EPS = 1e-6
MAX_BLOCK_PIXELS = 256  # pixels a partial statistic covers (see group_norm_by_pixel_blocks)


def group_norm_by_pixel_blocks(
    x: torch.Tensor, num_groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """F.group_norm(x, num_groups, weight, bias, eps) with its statistics taken in two levels: the
    mean and variance of each channel over blocks of pixels, then of each group, combined exactly
    (Chan's parallel variance; equal counts). x [N, C, *spatial].

    Why: compiled, F.group_norm reduces each of the 32 groups of a 1024x1024 activation in one
    long row: 32 rows for the whole GPU, about 1.4 ms a norm where reading the tensor takes 0.08.
    Here the first level is a reduction over pixels with thousands of independent outputs, reading
    channels-last memory in order, and the normalisation fuses with what follows (the SiLU)."""
    batch, channels = x.shape[:2]
    pixels = x.flatten(2).transpose(1, 2)  # [N, HW, C]: a view of channels-last memory
    num_pixels = pixels.shape[1]
    block = math.gcd(num_pixels, MAX_BLOCK_PIXELS)
    per_block = pixels.float().unflatten(1, (num_pixels // block, block))  # [N, NB, P, C]
    variance, mean = torch.var_mean(per_block, dim=2, correction=0)  # [N, NB, C] each
    mean = mean.unflatten(2, (num_groups, -1))  # [N, NB, G, C/G]
    variance = variance.unflatten(2, (num_groups, -1))
    group_mean = mean.mean(dim=(1, 3), keepdim=True)  # [N, 1, G, 1]
    group_variance = (variance + (mean - group_mean).square()).mean(dim=(1, 3), keepdim=True)
    scale = torch.rsqrt(group_variance + eps) * weight.float().view(1, 1, num_groups, -1)  # [N, 1, G, C/G]
    shift = bias.float().view(1, 1, num_groups, -1) - group_mean * scale
    broadcast = (batch, channels) + (1,) * (x.dim() - 2)
    return (x.float() * scale.reshape(broadcast) + shift.reshape(broadcast)).to(x.dtype)


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same keys) that can take its statistics by pixel blocks (`by_pixel_blocks`):
    set by VAEDecoder.use_pixel_block_norms for the compiled decode; eager keeps F.group_norm."""

    by_pixel_blocks = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.by_pixel_blocks:
            return group_norm_by_pixel_blocks(x, self.num_groups, self.weight, self.bias, self.eps)
        return super().forward(x)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int):
        super().__init__()
        self.norm1 = GroupNorm(groups, in_channels, eps=RESNET_EPS)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = GroupNorm(groups, out_channels, eps=RESNET_EPS)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return x + h


class AttentionBlock(nn.Module):
    """Single-head spatial self attention with a residual (diffusers' mid-block Attention)."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.group_norm = GroupNorm(groups, channels, eps=RESNET_EPS)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        h = self.group_norm(x.view(batch, channels, height * width)).transpose(1, 2)  # [B, HW, C]
        q, k, v = (proj(h).unsqueeze(1) for proj in (self.to_q, self.to_k, self.to_v))  # [B, 1, HW, C]
        h = F.scaled_dot_product_attention(q, k, v).squeeze(1).to(q.dtype)
        h = self.to_out[0](h).transpose(1, 2).reshape(batch, channels, height, width)
        return h + x


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, add_attention: bool):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock(channels, channels, groups) for _ in range(2)])
        self.attentions = nn.ModuleList([AttentionBlock(channels, groups)]) if add_attention else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.resnets[0](x)
        if self.attentions is not None:
            x = self.attentions[0](x)
        return self.resnets[1](x)


class Upsample(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class UpBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, num_layers: int, groups: int, add_upsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock(in_channels if i == 0 else out_channels, out_channels, groups)
            for i in range(num_layers)
        )
        self.upsamplers = nn.ModuleList([Upsample(out_channels)]) if add_upsample else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class Decoder(nn.Module):
    """diffusers' vae.Decoder (Z-Image's and FLUX.2's autoencoders)."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        channels = list(reversed(config.decoder_channels))
        groups = config.norm_num_groups
        self.conv_in = nn.Conv2d(config.latent_channels, channels[0], 3, padding=1)
        self.mid_block = MidBlock(channels[0], groups, config.mid_block_add_attention)
        self.up_blocks = nn.ModuleList()
        prev = channels[0]
        for i, out in enumerate(channels):
            is_last = i == len(channels) - 1
            self.up_blocks.append(UpBlock(prev, out, config.layers_per_block + 1, groups, not is_last))
            prev = out
        self.conv_norm_out = GroupNorm(groups, channels[-1], eps=RESNET_EPS)
        self.conv_out = nn.Conv2d(channels[-1], config.out_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.mid_block(self.conv_in(z))
        for block in self.up_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(x)))


class VAEDecoder(nn.Module):
    """Scaled latents -> uint8 frames. Keys: `decoder.*` (+ `post_quant_conv.*`)."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.decoder = Decoder(config)
        channels = config.latent_channels
        self.post_quant_conv = nn.Conv2d(channels, channels, 1) if config.use_post_quant_conv else None

    def use_pixel_block_norms(self, enabled: bool = True) -> None:
        """Every GroupNorm takes its statistics by pixel blocks (group_norm_by_pixel_blocks): for the
        compiled decode, where it is the faster form; the same result up to float rounding."""
        for module in self.modules():
            if isinstance(module, GroupNorm):
                module.by_pixel_blocks = enabled

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, C, h, w] as the DiT produces them -> image [B, 3, H, W] in [-1, 1] (unclamped)."""
        z = latents.to(self.decoder.conv_in.weight.dtype)
        z = z / self.config.scaling_factor + self.config.shift_factor
        if self.post_quant_conv is not None:
            z = self.post_quant_conv(z)
        return self.decoder(z)

    def decode_frames(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [C, h, w] -> uint8 [1, H, W, 3] on the same device (as diffusers' postprocess:
        round(clamp(x / 2 + 0.5, 0, 1) * 255))."""
        image = self.decode(latents.unsqueeze(0)).float()
        image = (image / 2 + 0.5).clamp(0, 1)
        return (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
