"""Building blocks of the LTX-2 video VAE (keys as diffusers' autoencoder_kl_ltx2): causal 3-D
convolutions, RMS-normed residual blocks, space-to-depth down- and depth-to-space upsamplers.

Tensors are [B, C, F, H, W]. `causal` pads time with copies of the first frame only (the encoder);
otherwise with copies of the first and last frames (LTX-2's decoder).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.ltx2.dit_layers import TimestepEmbedding, timestep_sinusoid


def per_channel_rms_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """diffusers PerChannelRMSNorm: x / sqrt(mean over channels of x^2 + eps), no weights."""
    return x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + eps)


def _triple(value: int | tuple[int, int, int]) -> tuple[int, int, int]:
    return value if isinstance(value, tuple) else (value, value, value)


class CausalConv3d(nn.Module):
    """Conv3d padded in space by the conv (zeros or reflect), in time by repeating edge frames."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, stride=1, padding_mode="zeros"
    ):
        super().__init__()
        self.kernel_size = _triple(kernel_size)
        padding = (0, self.kernel_size[1] // 2, self.kernel_size[2] // 2)
        self.conv = nn.Conv3d(
            in_channels,
            out_channels,
            self.kernel_size,
            stride=_triple(stride),
            padding=padding,
            padding_mode=padding_mode,
        )

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        time_kernel = self.kernel_size[0]
        if causal:
            x = torch.cat([x[:, :, :1].repeat(1, 1, time_kernel - 1, 1, 1), x], dim=2)
        else:
            side = (time_kernel - 1) // 2
            x = torch.cat(
                [x[:, :, :1].repeat(1, 1, side, 1, 1), x, x[:, :, -1:].repeat(1, 1, side, 1, 1)], dim=2
            )
        return self.conv(x)


class ResnetBlock3d(nn.Module):
    """diffusers LTX2VideoResnetBlock3d (no noise injection: LTX-2's decoder has none, and it draws
    unseeded noise)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        eps: float = 1e-6,
        timestep_conditioning: bool = False,
        padding_mode: str = "zeros",
    ):
        super().__init__()
        out_channels = out_channels or in_channels
        self.conv1 = CausalConv3d(in_channels, out_channels, 3, padding_mode=padding_mode)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3, padding_mode=padding_mode)
        self.norm3 = None
        self.conv_shortcut = None
        if in_channels != out_channels:
            self.norm3 = nn.LayerNorm(in_channels, eps=eps, elementwise_affine=True, bias=True)
            self.conv_shortcut = nn.Conv3d(in_channels, out_channels, kernel_size=1, stride=1)
        self.scale_shift_table = None
        if timestep_conditioning:
            self.scale_shift_table = nn.Parameter(torch.randn(4, in_channels) / in_channels**0.5)

    def forward(
        self, inputs: torch.Tensor, temb: torch.Tensor | None = None, causal: bool = True
    ) -> torch.Tensor:
        h = per_channel_rms_norm(inputs)
        if self.scale_shift_table is not None:
            temb = temb.unflatten(1, (4, -1)) + self.scale_shift_table[None, ..., None, None, None]
            shift_1, scale_1, shift_2, scale_2 = temb.unbind(dim=1)
            h = h * (1 + scale_1) + shift_1
        h = self.conv1(F.silu(h), causal=causal)
        h = per_channel_rms_norm(h)
        if self.scale_shift_table is not None:
            h = h * (1 + scale_2) + shift_2
        h = self.conv2(F.silu(h), causal=causal)
        if self.norm3 is not None:
            inputs = self.norm3(inputs.movedim(1, -1)).movedim(-1, 1)
        if self.conv_shortcut is not None:
            inputs = self.conv_shortcut(inputs)
        return h + inputs


def space_to_depth(x: torch.Tensor, stride: tuple[int, int, int]) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, C * s0 * s1 * s2, F / s0, H / s1, W / s2] (channel, then offsets)."""
    x = x.unflatten(4, (-1, stride[2])).unflatten(3, (-1, stride[1])).unflatten(2, (-1, stride[0]))
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(1, 4)


def depth_to_space(x: torch.Tensor, stride: tuple[int, int, int]) -> torch.Tensor:
    """The inverse of space_to_depth: [B, C * s0 * s1 * s2, F, H, W] -> [B, C, F * s0, H * s1, W * s2]."""
    batch, _, frames, height, width = x.shape
    x = x.reshape(batch, -1, stride[0], stride[1], stride[2], frames, height, width)
    return x.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)


class Downsampler3d(nn.Module):
    """Causal conv then space-to-depth, plus a space-to-depth residual averaged over channel groups."""

    def __init__(
        self, in_channels: int, out_channels: int, stride: tuple[int, int, int], padding_mode="zeros"
    ):
        super().__init__()
        self.stride = stride
        volume = stride[0] * stride[1] * stride[2]
        self.group_size = (in_channels * volume) // out_channels
        self.conv = CausalConv3d(in_channels, out_channels // volume, 3, padding_mode=padding_mode)

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        x = torch.cat([x[:, :, : self.stride[0] - 1], x], dim=2)  # the first frame pads time
        residual = space_to_depth(x, self.stride).unflatten(1, (-1, self.group_size)).mean(dim=2)
        return space_to_depth(self.conv(x, causal=causal), self.stride) + residual


class Upsampler3d(nn.Module):
    """Causal conv then depth-to-space (dropping the frames before the causal first), with an
    optional depth-to-space residual repeated over channels."""

    def __init__(
        self,
        in_channels: int,
        stride: tuple[int, int, int],
        residual: bool,
        upscale_factor: int,
        padding_mode="zeros",
    ):
        super().__init__()
        self.stride = stride
        self.residual = residual
        self.upscale_factor = upscale_factor
        volume = stride[0] * stride[1] * stride[2]
        self.conv = CausalConv3d(
            in_channels, in_channels * volume // upscale_factor, 3, padding_mode=padding_mode
        )

    def forward(self, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
        first = self.stride[0] - 1
        out = depth_to_space(self.conv(x, causal=causal), self.stride)[:, :, first:]
        if self.residual:
            volume = self.stride[0] * self.stride[1] * self.stride[2]
            residual = depth_to_space(x, self.stride).repeat(1, volume // self.upscale_factor, 1, 1, 1)
            out = out + residual[:, :, first:]
        return out


class TimeConditioning(nn.Module):
    """PixArtAlphaCombinedTimestepSizeEmbeddings(dim, 0): timestep [B] -> [B, dim] (key
    `timestep_embedder`), for the decoder's timestep-conditioned blocks."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(256, dim)

    def forward(self, timestep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.timestep_embedder(timestep_sinusoid(timestep.flatten()).to(dtype))


STRIDES = {"spatial": (1, 2, 2), "temporal": (2, 1, 1), "spatiotemporal": (2, 2, 2)}


class DownBlock3d(nn.Module):
    def __init__(self, in_channels, out_channels, num_layers, eps, downsample: bool, kind: str, padding_mode):
        super().__init__()
        self.resnets = nn.ModuleList(
            ResnetBlock3d(in_channels, in_channels, eps, padding_mode=padding_mode) for _ in range(num_layers)
        )
        self.downsamplers = None
        if downsample:
            if kind == "conv":
                layer = CausalConv3d(in_channels, in_channels, 3, stride=(2, 2, 2), padding_mode=padding_mode)
            else:
                layer = Downsampler3d(in_channels, out_channels, STRIDES[kind], padding_mode)
            self.downsamplers = nn.ModuleList([layer])

    def forward(self, x: torch.Tensor, causal: bool) -> torch.Tensor:
        for resnet in self.resnets:
            x = resnet(x, None, causal=causal)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x, causal=causal)
        return x


class MidBlock3d(nn.Module):
    def __init__(
        self, channels: int, num_layers: int, eps: float, timestep_conditioning: bool, padding_mode: str
    ):
        super().__init__()
        self.time_embedder = TimeConditioning(channels * 4) if timestep_conditioning else None
        self.resnets = nn.ModuleList(
            ResnetBlock3d(channels, channels, eps, timestep_conditioning, padding_mode)
            for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None, causal: bool) -> torch.Tensor:
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype).view(x.shape[0], -1, 1, 1, 1)
        for resnet in self.resnets:
            x = resnet(x, temb, causal=causal)
        return x


class UpBlock3d(nn.Module):
    def __init__(
        self, in_channels, out_channels, num_layers, eps, upsample: bool, kind: str, timestep_conditioning: bool,
        residual: bool, upscale_factor: int, padding_mode: str,
    ):  # fmt: skip
        super().__init__()
        self.time_embedder = TimeConditioning(in_channels * 4) if timestep_conditioning else None
        self.conv_in = None
        if in_channels != out_channels:
            self.conv_in = ResnetBlock3d(in_channels, out_channels, eps, timestep_conditioning, padding_mode)
        self.upsamplers = None
        if upsample:
            upsampler = Upsampler3d(
                out_channels * upscale_factor, STRIDES[kind], residual, upscale_factor, padding_mode
            )
            self.upsamplers = nn.ModuleList([upsampler])
        self.resnets = nn.ModuleList(
            ResnetBlock3d(out_channels, out_channels, eps, timestep_conditioning, padding_mode)
            for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None, causal: bool) -> torch.Tensor:
        if self.conv_in is not None:
            x = self.conv_in(x, temb, causal=causal)
        if self.time_embedder is not None:
            temb = self.time_embedder(temb, x.dtype).view(x.shape[0], -1, 1, 1, 1)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, causal=causal)
        for resnet in self.resnets:
            x = resnet(x, temb, causal=causal)
        return x
