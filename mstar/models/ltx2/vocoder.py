"""The LTX-2 vocoder (diffusers LTX2Vocoder, a HiFi-GAN / BigVGAN-style generator, same state-dict
keys): mel spectrogram [B, C, T, mel_bins] -> waveform [B, out_channels, T * prod(upsample_factors)]
in [-1, 1], plain PyTorch. LTX-2's uses leaky ReLU and a final tanh; snake activations with
anti-aliased resampling (LTX-2.3's generators) are here too.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.ltx2.config import VocoderConfig, from_json_dict


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """Kaiser-windowed sinc low-pass kernel [kernel_size] (diffusers kaiser_sinc_filter1d)."""
    delta_f = 4 * half_width
    half_size = kernel_size // 2
    amplitude = 2.285 * (half_size - 1) * math.pi * delta_f + 7.95
    if amplitude > 50.0:
        beta = 0.1102 * (amplitude - 8.7)
    elif amplitude >= 21.0:
        beta = 0.5842 * (amplitude - 21) ** 0.4 + 0.07886 * (amplitude - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    even = kernel_size % 2 == 0
    time = torch.arange(-half_size, half_size) + 0.5 if even else torch.arange(kernel_size) - half_size
    if cutoff == 0.0:
        return torch.zeros_like(time)
    time = 2 * cutoff * time
    sinc = torch.where(time == 0, torch.ones_like(time), torch.sin(math.pi * time) / math.pi / time)
    kernel = 2 * cutoff * window * sinc
    return kernel / kernel.sum()


class DownSample1d(nn.Module):
    """Anti-aliasing low-pass then decimation by `ratio` (buffer `filter`)."""

    def __init__(self, ratio: int = 2, kernel_size: int | None = None):
        super().__init__()
        self.ratio = ratio
        self.kernel_size = kernel_size or int(6 * ratio // 2) * 2
        self.pad_left = self.kernel_size // 2 + (self.kernel_size % 2) - 1
        self.pad_right = self.kernel_size // 2
        kernel = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, self.kernel_size)
        self.register_buffer("filter", kernel.view(1, 1, self.kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        return F.conv1d(x, self.filter.expand(x.shape[1], -1, -1), stride=self.ratio, groups=x.shape[1])


class UpSample1d(nn.Module):
    """Zero-stuffing by `ratio` through a transposed Kaiser-sinc low-pass (buffer `filter`)."""

    def __init__(self, ratio: int = 2, kernel_size: int | None = None):
        super().__init__()
        self.ratio = ratio
        self.kernel_size = int(6 * ratio // 2) * 2 if kernel_size is None else kernel_size
        self.pad = self.kernel_size // ratio - 1
        self.pad_left = self.pad * ratio + (self.kernel_size - ratio) // 2
        self.pad_right = self.pad * ratio + (self.kernel_size - ratio + 1) // 2
        kernel = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, self.kernel_size)
        self.register_buffer("filter", kernel.view(1, 1, self.kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        kernel = self.filter.to(dtype=x.dtype, device=x.device).expand(channels, -1, -1)
        x = self.ratio * F.conv_transpose1d(x, kernel, stride=self.ratio, groups=channels)
        return x[..., self.pad_left : -self.pad_right]


class SnakeBeta(nn.Module):
    """x + 1 / beta * sin^2(alpha * x) per channel, log-scale parameters (diffusers SnakeBeta)."""

    def __init__(self, channels: int, use_beta: bool = True, eps: float = 1e-9):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels)) if use_beta else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha.view(1, -1, 1))
        amplitude = torch.exp(self.beta.view(1, -1, 1)) if self.beta is not None else alpha
        return x + (1.0 / (amplitude + self.eps)) * torch.sin(x * alpha).pow(2)


class AntiAliasAct1d(nn.Module):
    """Upsample, activation, downsample (keys `upsample`, `act`, `downsample`)."""

    def __init__(self, act: nn.Module, ratio: int = 2, kernel_size: int = 12):
        super().__init__()
        self.upsample = UpSample1d(ratio, kernel_size)
        self.act = act
        self.downsample = DownSample1d(ratio, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _activation(config: VocoderConfig, channels: int) -> nn.Module:
    if config.act_fn == "snakebeta":
        act = SnakeBeta(channels, use_beta=True)
    elif config.act_fn == "snake":
        act = SnakeBeta(channels, use_beta=False)
    else:
        act = nn.LeakyReLU(negative_slope=config.leaky_relu_negative_slope)
    if config.antialias:
        act = AntiAliasAct1d(act, config.antialias_ratio, config.antialias_kernel_size)
    return act


class ResBlock(nn.Module):
    """Dilated residual convolutions (diffusers' vocoder ResBlock)."""

    def __init__(self, config: VocoderConfig, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()

        def conv(dilation: int) -> nn.Conv1d:
            return nn.Conv1d(channels, channels, kernel_size, dilation=dilation, padding="same")

        self.convs1 = nn.ModuleList(conv(d) for d in dilations)
        self.acts1 = nn.ModuleList(_activation(config, channels) for _ in dilations)
        self.convs2 = nn.ModuleList(conv(1) for _ in dilations)
        self.acts2 = nn.ModuleList(_activation(config, channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for act1, conv1, act2, conv2 in zip(self.acts1, self.convs1, self.acts2, self.convs2, strict=True):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class LTX2Vocoder(nn.Module):
    def __init__(self, config: VocoderConfig):
        super().__init__()
        c = self.config = config
        if c.act_fn not in ("snakebeta", "snake", "leaky_relu"):
            raise ValueError(f"vocoder: unknown act_fn '{c.act_fn}'")
        if c.act_fn == "leaky_relu" and c.antialias:
            # diffusers builds nested anti-aliasing wrappers there (its second activations reuse the
            # first loop's last one); no released checkpoint has that combination.
            raise ValueError("vocoder: anti-aliased leaky ReLU is not supported")
        if len(c.upsample_kernel_sizes) != len(c.upsample_factors):
            raise ValueError("vocoder: upsample_kernel_sizes and upsample_factors differ in length")
        self.conv_in = nn.Conv1d(c.in_channels, c.hidden_channels, kernel_size=7, stride=1, padding=3)
        self.upsamplers = nn.ModuleList()
        self.resnets = nn.ModuleList()
        channels = c.hidden_channels
        for stride, kernel_size in zip(c.upsample_factors, c.upsample_kernel_sizes, strict=True):
            out_channels = channels // 2
            padding = (kernel_size - stride) // 2
            self.upsamplers.append(
                nn.ConvTranspose1d(channels, out_channels, kernel_size, stride, padding=padding)
            )
            for resnet_kernel, dilations in zip(c.resnet_kernel_sizes, c.resnet_dilations, strict=True):
                self.resnets.append(ResBlock(c, out_channels, resnet_kernel, dilations))
            channels = out_channels
        if c.act_fn == "leaky_relu":
            self.act_out = nn.LeakyReLU()  # diffusers' final activation ignores the configured slope
        else:
            self.act_out = AntiAliasAct1d(SnakeBeta(channels), c.antialias_ratio, c.antialias_kernel_size)
        self.conv_out = nn.Conv1d(channels, c.out_channels, 7, stride=1, padding=3, bias=c.final_bias)

    @classmethod
    def from_config(cls, config: VocoderConfig | dict) -> LTX2Vocoder:
        if isinstance(config, dict):
            config = from_json_dict(VocoderConfig, config)
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.conv_in.weight.dtype

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, C, T, mel_bins] (the audio VAE's output) -> waveform [B, out_channels, samples]."""
        c = self.config
        x = self.conv_in(mel.to(self.dtype).transpose(2, 3).flatten(1, 2))  # [B, C * mel_bins, T]
        per_stage = len(c.resnet_kernel_sizes)
        for index, upsampler in enumerate(self.upsamplers):
            if c.act_fn == "leaky_relu":
                x = F.leaky_relu(x, negative_slope=c.leaky_relu_negative_slope)
            x = upsampler(x)
            outputs = [self.resnets[j](x) for j in range(index * per_stage, (index + 1) * per_stage)]
            x = torch.mean(torch.stack(outputs, dim=0), dim=0)
        x = self.conv_out(self.act_out(x))
        if c.final_act_fn == "tanh":
            return torch.tanh(x)
        if c.final_act_fn == "clamp":
            return torch.clamp(x, -1, 1)
        return x
