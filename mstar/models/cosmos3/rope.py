"""Cosmos3's interleaved 3D mRoPE: a (t, h, w) position per token, then cos/sin tables.

Text tokens have one position on all three axes (0, 1, ...); vision tokens start their time axis
past the text (geometry.vision_temporal_offset), scaled by fps for videos, and count h and w from 0.
Head frequency j rotates by the h position when j % 3 == 1 (first 3 * axes[1] frequencies), the w
position when j % 3 == 2 (first 3 * axes[2]), else the t position, as diffusers' Cosmos3 rotary.
Positions and angles are float32 on the CPU with diffusers' operations, so tables are bit-equal.
"""

from __future__ import annotations

import torch

from mstar.models.cosmos3.config import Cosmos3TransformerConfig
from mstar.models.cosmos3.geometry import fps_modulated


def text_positions(num_tokens: int) -> torch.Tensor:
    """float32 [L, 3]: 0 .. L-1 on every axis."""
    return torch.arange(num_tokens, dtype=torch.float32).unsqueeze(1).expand(-1, 3).contiguous()


def vision_positions(
    grid: tuple[int, int, int],
    temporal_offset: int,
    fps: float,
    config: Cosmos3TransformerConfig,
    temporal_compression: int,
) -> torch.Tensor:
    """float32 [F*H*W, 3] (t, h, w) of a patch grid, tokens in frame, row, column order."""
    frames, height, width = grid
    if fps_modulated(config, frames):
        ticks_per_s = fps / temporal_compression
        base_ticks_per_s = float(config.base_fps) / temporal_compression
        frame_times = torch.arange(frames, dtype=torch.float32) / ticks_per_s * base_ticks_per_s
        t_index = frame_times + temporal_offset
    else:
        t_index = torch.arange(frames, dtype=torch.float32) + int(temporal_offset)
    t_index = t_index.view(-1, 1).expand(-1, height * width).flatten()
    h_index = torch.arange(height, dtype=torch.int64).view(1, -1, 1).expand(frames, -1, width).flatten()
    w_index = torch.arange(width, dtype=torch.int64).view(1, 1, -1).expand(frames, height, -1).flatten()
    if not config.unified_3d_mrope_reset_spatial_ids:
        h_index = h_index + int(temporal_offset)
        w_index = w_index + int(temporal_offset)
    return torch.stack([t_index, h_index.to(torch.float32), w_index.to(torch.float32)], dim=1)


class MultimodalRotary:
    """cos/sin tables [N, 1, head_dim] for positions [N, 3]; no parameters, nothing to load."""

    def __init__(self, config: Cosmos3TransformerConfig):
        head_dim = config.head_dim
        # Explicit CPU: the model may be built under a meta-device context.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        self.inv_freq = 1.0 / (config.rope_theta**exponents)  # float32 [D/2]
        axis = torch.zeros(head_dim // 2, dtype=torch.int64, device="cpu")
        _, h_freqs, w_freqs = config.rope_axes_dim
        axis[1 : 3 * h_freqs : 3] = 1
        axis[2 : 3 * w_freqs : 3] = 2
        self.axis = axis  # which position (t, h, w) rotates frequency j

    def tables(
        self, positions: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions float32 [N, 3] -> (cos, sin) [N, 1, head_dim] in `dtype` (the model's)."""
        angles = positions[:, self.axis] * self.inv_freq  # [N, D/2], one rounding as diffusers
        doubled = torch.cat([angles, angles], dim=-1)
        cos, sin = doubled.cos().to(dtype), doubled.sin().to(dtype)
        return cos.unsqueeze(1).to(device), sin.unsqueeze(1).to(device)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated by halves (x * cos + rotate_half(x) * sin); cos/sin [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated_half * sin
