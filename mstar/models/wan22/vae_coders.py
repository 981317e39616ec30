"""Wan VAE encoder and decoder stacks (2.1 plain and 2.2 residual variants), diffusers key layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.wan22.vae_blocks import (
    CausalConv3d,
    FrameCache,
    MidBlock,
    Resample,
    ResidualBlock,
    RMSNorm,
    pin_frame_layout,
)


class AvgDown3D(nn.Module):
    """Parameter-free shortcut: fold (t, h, w) factors into channels, average channel groups."""

    def __init__(self, in_channels: int, out_channels: int, factor_t: int, factor_s: int = 1):
        super().__init__()
        self.out_channels = out_channels
        self.factor_t = factor_t
        self.factor_s = factor_s
        self.factor = factor_t * factor_s * factor_s
        if in_channels * self.factor % out_channels != 0:
            raise ValueError(
                f"in_channels*factor ({in_channels}*{self.factor}) not divisible by {out_channels}"
            )
        self.group_size = in_channels * self.factor // out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad_t = (self.factor_t - x.shape[2] % self.factor_t) % self.factor_t
        x = F.pad(x, (0, 0, 0, 0, pad_t, 0))
        b, c, t, h, w = x.shape
        ft, fs = self.factor_t, self.factor_s
        x = x.view(b, c, t // ft, ft, h // fs, fs, w // fs, fs)
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6).contiguous()
        x = x.view(b, self.out_channels, self.group_size, t // ft, h // fs, w // fs)
        return x.mean(dim=2)


class DupUp3D(nn.Module):
    """Parameter-free shortcut: repeat channels, unfold them into (t, h, w) factors."""

    def __init__(self, in_channels: int, out_channels: int, factor_t: int, factor_s: int = 1):
        super().__init__()
        self.out_channels = out_channels
        self.factor_t = factor_t
        self.factor_s = factor_s
        factor = factor_t * factor_s * factor_s
        if out_channels * factor % in_channels != 0:
            raise ValueError(f"out_channels*factor ({out_channels}*{factor}) not divisible by {in_channels}")
        self.repeats = out_channels * factor // in_channels

    def forward(self, x: torch.Tensor, first_chunk: bool = False) -> torch.Tensor:
        ft, fs = self.factor_t, self.factor_s
        x = x.repeat_interleave(self.repeats, dim=1)
        b, _, t, h, w = x.shape
        x = x.view(b, self.out_channels, ft, fs, fs, t, h, w)
        x = x.permute(0, 1, 5, 2, 6, 3, 7, 4).contiguous()
        x = x.view(b, self.out_channels, t * ft, h * fs, w * fs)
        if first_chunk:
            x = x[:, :, ft - 1 :]  # the first latent frame decodes to one frame
        return x


class ResidualDownBlock(nn.Module):
    """Wan 2.2 encoder stage: residual blocks + downsample, plus an AvgDown3D shortcut."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temporal_downsample=False, down_flag=False):
        super().__init__()
        self.avg_shortcut = AvgDown3D(
            in_dim, out_dim, factor_t=2 if temporal_downsample else 1, factor_s=2 if down_flag else 1
        )
        dims = [in_dim] + [out_dim] * num_res_blocks
        self.resnets = nn.ModuleList([ResidualBlock(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True)])
        self.downsampler = None
        if down_flag:
            self.downsampler = Resample(out_dim, "downsample3d" if temporal_downsample else "downsample2d")

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        shortcut = self.avg_shortcut(x)
        for resnet in self.resnets:
            x = resnet(x, cache)
        if self.downsampler is not None:
            x = self.downsampler(x, cache)
        return x + shortcut


class ResidualUpBlock(nn.Module):
    """Wan 2.2 decoder stage: residual blocks + upsample, plus a DupUp3D shortcut."""

    def __init__(self, in_dim, out_dim, num_res_blocks, temporal_upsample=False, up_flag=False):
        super().__init__()
        self.avg_shortcut = None
        if up_flag:
            self.avg_shortcut = DupUp3D(in_dim, out_dim, factor_t=2 if temporal_upsample else 1, factor_s=2)
        dims = [in_dim] + [out_dim] * (num_res_blocks + 1)
        self.resnets = nn.ModuleList([ResidualBlock(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True)])
        self.upsampler = None
        if up_flag:
            mode = "upsample3d" if temporal_upsample else "upsample2d"
            self.upsampler = Resample(out_dim, mode, upsample_out_dim=out_dim)

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        x_in = x
        for resnet in self.resnets:
            x = resnet(x, cache)
        if self.upsampler is not None:
            x = self.upsampler(x, cache)
        if self.avg_shortcut is not None:
            first_chunk = cache is not None and cache.first_chunk
            x = pin_frame_layout(x + self.avg_shortcut(x_in, first_chunk=first_chunk), like=x_in)
        return x


class UpBlock(nn.Module):
    """Wan 2.1 decoder stage: residual blocks + optional upsample (halves the channels)."""

    def __init__(self, in_dim, out_dim, num_res_blocks, upsample_mode: str | None = None):
        super().__init__()
        dims = [in_dim] + [out_dim] * (num_res_blocks + 1)
        self.resnets = nn.ModuleList([ResidualBlock(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True)])
        self.upsamplers = None
        if upsample_mode is not None:
            self.upsamplers = nn.ModuleList([Resample(out_dim, upsample_mode)])

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, cache)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, cache)
        return x


def _encoder_stage_layers(in_dim, out_dim, num_res_blocks, temporal_downsample, down_flag) -> list[nn.Module]:
    """Wan 2.1 encoder stage as flat layers (its state-dict keys are down_blocks.<flat index>)."""
    dims = [in_dim] + [out_dim] * num_res_blocks
    layers: list[nn.Module] = [ResidualBlock(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True)]
    if down_flag:
        layers.append(Resample(out_dim, "downsample3d" if temporal_downsample else "downsample2d"))
    return layers


class Encoder3d(nn.Module):
    def __init__(
        self, in_channels, dim, z_dim, dim_mult, num_res_blocks, temporal_downsample, is_residual: bool
    ):
        super().__init__()
        dims = [dim * u for u in [1, *dim_mult]]
        self.conv_in = CausalConv3d(in_channels, dims[0], 3, padding=1)
        self.down_blocks = nn.ModuleList()
        num_stages = len(dim_mult)
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            down_flag = i != num_stages - 1
            temporal = temporal_downsample[i] if down_flag else False
            if is_residual:
                self.down_blocks.append(
                    ResidualDownBlock(in_dim, out_dim, num_res_blocks, temporal, down_flag)
                )
            else:
                self.down_blocks.extend(
                    _encoder_stage_layers(in_dim, out_dim, num_res_blocks, temporal, down_flag)
                )
        self.mid_block = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1], images=False)
        self.conv_out = CausalConv3d(dims[-1], z_dim, 3, padding=1)

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        x = self.conv_in(x, cache)
        for layer in self.down_blocks:
            x = layer(x, cache)
        x = self.mid_block(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)


class Decoder3d(nn.Module):
    def __init__(
        self, dim, z_dim, dim_mult, num_res_blocks, temporal_upsample, out_channels, is_residual: bool
    ):
        super().__init__()
        dims = [dim * u for u in [dim_mult[-1], *dim_mult[::-1]]]
        self.conv_in = CausalConv3d(z_dim, dims[0], 3, padding=1)
        self.mid_block = MidBlock(dims[0])
        self.up_blocks = nn.ModuleList()
        num_stages = len(dim_mult)
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            up_flag = i != num_stages - 1
            temporal = temporal_upsample[i] if up_flag else False
            if is_residual:
                block = ResidualUpBlock(in_dim, out_dim, num_res_blocks, temporal, up_flag)
            else:
                # Wan 2.1 upsamplers halve the channels, so later stages take half of dims[i].
                in_dim = in_dim // 2 if i > 0 else in_dim
                mode = None if not up_flag else ("upsample3d" if temporal else "upsample2d")
                block = UpBlock(in_dim, out_dim, num_res_blocks, mode)
            self.up_blocks.append(block)
        self.norm_out = RMSNorm(dims[-1], images=False)
        self.conv_out = CausalConv3d(dims[-1], out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        x = self.conv_in(x, cache)
        x = self.mid_block(x, cache)
        for up_block in self.up_blocks:
            x = up_block(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, C*p*p, F, H/p, W/p], channel order (c, p_w, p_h) as diffusers."""
    if patch_size == 1:
        return x
    b, c, f, h, w = x.shape
    if h % patch_size or w % patch_size:
        raise ValueError(f"height {h} and width {w} must be multiples of the patch size {patch_size}")
    p = patch_size
    x = x.view(b, c, f, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5).contiguous()
    return x.view(b, c * p * p, f, h // p, w // p)


def unpatchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Inverse of patchify: [B, C*p*p, F, H, W] -> [B, C, F, H*p, W*p]."""
    if patch_size == 1:
        return x
    b, c_patches, f, h, w = x.shape
    p = patch_size
    x = x.view(b, c_patches // (p * p), p, p, f, h, w).permute(0, 1, 4, 5, 3, 6, 2).contiguous()
    return x.view(b, c_patches // (p * p), f, h * p, w * p)
