"""The LTX-2 audio VAE decoder (diffusers AutoencoderKLLTX2Audio's decoder, same state-dict keys):
audio latents [B, C, L, M'] -> mel spectrogram [B, channels, T, mel_bins], plain PyTorch, with the
latent normalisation LTX2Pipeline applies (statistics over the packed C * M' features).

    decoder = LTX2AudioDecoder(AudioVAEConfig(...))   # load: ignore_unexpected=("encoder.",)
    mel = decoder.decode(decoder.denormalize(latents))

Time is the height axis of these 2-D convolutions; "height" causality pads it on the past side only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mstar.models.ltx2.config import AudioVAEConfig, from_json_dict


def pixel_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """diffusers LTX2AudioPixelNorm over channels."""
    return x / torch.sqrt(torch.mean(x**2, dim=1, keepdim=True) + eps)


class CausalConv2d(nn.Module):
    """Conv2d padded asymmetrically along the causal axis (the past side), centred on the other."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, causality_axis: str):
        super().__init__()
        pad = kernel_size - 1
        if causality_axis == "none":
            self.padding = (pad // 2, pad - pad // 2, pad // 2, pad - pad // 2)
        elif causality_axis in ("width", "width-compatibility"):
            self.padding = (pad, 0, pad // 2, pad - pad // 2)
        elif causality_axis == "height":
            self.padding = (pad // 2, pad - pad // 2, pad, 0)
        else:
            raise ValueError(f"audio VAE: unknown causality_axis '{causality_axis}'")
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.padding))


def _conv(in_channels: int, out_channels: int, kernel_size: int, causality_axis: str | None) -> nn.Module:
    if causality_axis is None:
        return nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
    return CausalConv2d(in_channels, out_channels, kernel_size, causality_axis)


class _Norm(nn.Module):
    """GroupNorm(32) or the weightless pixel norm (LTX-2's)."""

    def __init__(self, channels: int, norm_type: str):
        super().__init__()
        if norm_type not in ("group", "pixel"):
            raise ValueError(f"audio VAE: unknown norm_type '{norm_type}'")
        self.group = nn.GroupNorm(32, channels, eps=1e-6) if norm_type == "group" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pixel_norm(x) if self.group is None else self.group(x)


def _norm_module(channels: int, norm_type: str) -> nn.Module:
    """The module diffusers registers as `norm*` (a GroupNorm's keys, or none for pixel norm)."""
    norm = _Norm(channels, norm_type)
    return norm.group if norm.group is not None else norm


class ResnetBlock(nn.Module):
    """diffusers LTX2AudioResnetBlock without timestep embedding (the VAE has none)."""

    def __init__(self, in_channels: int, out_channels: int, norm_type: str, causality_axis: str | None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.norm1 = _norm_module(in_channels, norm_type)
        self.conv1 = _conv(in_channels, out_channels, 3, causality_axis)
        self.norm2 = _norm_module(out_channels, norm_type)
        self.conv2 = _conv(out_channels, out_channels, 3, causality_axis)
        if in_channels != out_channels:
            self.nin_shortcut = _conv(in_channels, out_channels, 1, causality_axis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.in_channels != self.out_channels:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """diffusers LTX2AudioAttnBlock: single-head attention over all positions of one spectrogram."""

    def __init__(self, channels: int, norm_type: str):
        super().__init__()
        self.norm = _norm_module(channels, norm_type)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        batch, channels, height, width = q.shape
        q = q.reshape(batch, channels, height * width).permute(0, 2, 1)
        k = k.reshape(batch, channels, height * width)
        weights = torch.softmax(torch.bmm(q, k) * (int(channels) ** (-0.5)), dim=2)
        out = torch.bmm(v.reshape(batch, channels, height * width), weights.permute(0, 2, 1))
        return x + self.proj_out(out.reshape(batch, channels, height, width))


class Upsample(nn.Module):
    """Nearest 2x, then a conv; a causal axis drops its first row of outputs."""

    def __init__(self, channels: int, causality_axis: str | None):
        super().__init__()
        self.causality_axis = causality_axis
        self.conv = _conv(channels, channels, 3, causality_axis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        if self.causality_axis == "height":
            return x[:, :, 1:, :]
        if self.causality_axis == "width":
            return x[:, :, :, 1:]
        return x


class _Stage(nn.Module):
    """One resolution of the decoder (keys `block`, `attn`, `upsample`)."""

    def __init__(self):
        super().__init__()
        self.block = nn.ModuleList()
        self.attn = nn.ModuleList()


class _Mid(nn.Module):
    def __init__(self, channels: int, config: AudioVAEConfig):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, config.norm_type, config.causality_axis)
        self.attn_1 = (
            AttnBlock(channels, config.norm_type) if config.mid_block_add_attention else nn.Identity()
        )
        self.block_2 = ResnetBlock(channels, channels, config.norm_type, config.causality_axis)


class _Decoder(nn.Module):
    """diffusers LTX2AudioDecoder (keys under `decoder.`)."""

    def __init__(self, config: AudioVAEConfig):
        super().__init__()
        c = config
        num_levels = len(c.ch_mult)
        channels = c.base_channels * c.ch_mult[-1]
        resolution = c.resolution // 2 ** (num_levels - 1)
        self.conv_in = _conv(c.latent_channels, channels, 3, c.causality_axis)
        self.mid = _Mid(channels, c)
        stages = []
        for level in reversed(range(num_levels)):
            stage = _Stage()
            out_channels = c.base_channels * c.ch_mult[level]
            for _ in range(c.num_res_blocks + 1):
                stage.block.append(ResnetBlock(channels, out_channels, c.norm_type, c.causality_axis))
                channels = out_channels
                if c.attn_resolutions and resolution in c.attn_resolutions:
                    stage.attn.append(AttnBlock(channels, c.norm_type))
            if level != 0:
                stage.upsample = Upsample(channels, c.causality_axis)
                resolution *= 2
            stages.insert(0, stage)
        self.up = nn.ModuleList(stages)
        self.norm_out = _norm_module(channels, c.norm_type)
        self.conv_out = _conv(channels, c.output_channels, 3, c.causality_axis)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        x = self.mid.block_2(self.mid.attn_1(self.mid.block_1(x)))
        for level in reversed(range(len(self.up))):
            stage = self.up[level]
            for index, block in enumerate(stage.block):
                x = block(x)
                if len(stage.attn) > 0:
                    x = stage.attn[index](x)
            if level != 0:
                x = stage.upsample(x)
        return self.conv_out(F.silu(self.norm_out(x)))


class LTX2AudioDecoder(nn.Module):
    """The audio VAE's decoder and latent statistics (top-level `latents_mean` / `latents_std`)."""

    def __init__(self, config: AudioVAEConfig):
        super().__init__()
        self.config = config
        self.decoder = _Decoder(config)
        # diffusers sizes the statistics by base_channels; they apply to the packed C * M' features.
        self.register_buffer("latents_mean", torch.zeros(config.base_channels))
        self.register_buffer("latents_std", torch.ones(config.base_channels))

    @classmethod
    def from_config(cls, config: AudioVAEConfig | dict) -> LTX2AudioDecoder:
        if isinstance(config, dict):
            config = from_json_dict(AudioVAEConfig, config)
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _stats(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Statistics shaped for latents [..., C, L, M'] (the pipeline normalises packed [L, C * M']
        features, feature c * M' + m)."""
        shape = (latents.shape[-3], 1, latents.shape[-1])
        mean = self.latents_mean.view(shape).to(latents.device, latents.dtype)
        std = self.latents_std.view(shape).to(latents.device, latents.dtype)
        return mean, std

    def normalize(self, latents: torch.Tensor) -> torch.Tensor:
        mean, std = self._stats(latents)
        return (latents - mean) / std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """The DiT's audio latents -> the decoder's (LTX2Pipeline._denormalize_audio_latents)."""
        mean, std = self._stats(latents)
        return (latents * std) + mean

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Denormalised latents [B, C, L, M'] -> mel spectrogram [B, output_channels, T, mel_bins],
        T = 4L - 3 with a causal time axis (the frames the decoder makes are cut or zero-padded
        to it, as diffusers does)."""
        c = self.config
        _, _, frames, mel_bins = latents.shape
        target_frames = frames * c.temporal_compression
        if c.causality_axis is not None:
            target_frames = max(target_frames - (c.temporal_compression - 1), 1)
        target_bins = c.mel_bins if c.mel_bins is not None else mel_bins
        out = self.decoder(latents.to(self.dtype))
        out = out[:, : c.output_channels, :target_frames, :target_bins]
        missing_frames, missing_bins = target_frames - out.shape[2], target_bins - out.shape[3]
        if missing_frames > 0 or missing_bins > 0:
            out = F.pad(out, (0, max(missing_bins, 0), 0, max(missing_frames, 0)))
        return out
