"""LTX-2 rotary embeddings: fractional positions in seconds and pixels, not integer indices.

Video tokens sit at the midpoints of their patches in pixel space (frames in seconds at the
conditioning frame rate, the causal first frame shifted), audio tokens at the midpoints of their
mel windows in seconds; each axis is divided by its base size and mapped to [-1, 1] before the
frequencies. Tables are per item (one request's sizes) and float32, computed with the same
operations as diffusers' LTX2AudioVideoRotaryPosEmbed and LTX2RotaryPosEmbed1d.

Two layouts, the checkpoint's `rope_type`:
  interleaved: cos/sin [T, dim]; each (even, odd) feature pair is rotated.
  split:       cos/sin [T, H, dim / (2H)]; each head's first half is rotated with its second half.
"""

from __future__ import annotations

import math

import torch

INTERLEAVED = "interleaved"
SPLIT = "split"


def video_coords(
    frames: int,
    height: int,
    width: int,
    frame_rate: float,
    patch_size: tuple[int, int, int],
    scale_factors: tuple[int, ...],
    causal_offset: int,
) -> torch.Tensor:
    """[3, T, 2] float32 (start, end) of every patch along (frame, height, width) in pixel space,
    frames in seconds. Tokens are frame-major, then rows, then columns (the packing order)."""
    patch_t, patch_h, patch_w = patch_size
    grid_f = torch.arange(0, frames, patch_t, dtype=torch.float32)
    grid_h = torch.arange(0, height, patch_h, dtype=torch.float32)
    grid_w = torch.arange(0, width, patch_w, dtype=torch.float32)
    grid = torch.stack(torch.meshgrid(grid_f, grid_h, grid_w, indexing="ij"), dim=0)  # [3, F, H, W]
    ends = grid + torch.tensor(patch_size, dtype=grid.dtype).view(3, 1, 1, 1)
    latent = torch.stack([grid, ends], dim=-1).flatten(1, 3)  # [3, T, 2]
    pixel = latent * torch.tensor(scale_factors).view(-1, 1, 1)
    # The first latent frame covers one pixel frame, the others `scale_factors[0]`.
    pixel[0] = (pixel[0] + causal_offset - scale_factors[0]).clamp(min=0)
    pixel[0] = pixel[0] / frame_rate
    return pixel


def audio_coords(
    frames: int, patch_t: int, scale_factor: int, causal_offset: int, hop_length: int, sample_rate: int
) -> torch.Tensor:
    """[1, T, 2] float32 (start, end) in seconds of every audio latent frame's mel window."""
    grid = torch.arange(0, frames, patch_t, dtype=torch.float32)
    start = (grid * scale_factor + causal_offset - scale_factor).clip(min=0)
    end = ((grid + patch_t) * scale_factor + causal_offset - scale_factor).clip(min=0)
    start_s = start * hop_length / sample_rate
    end_s = end * hop_length / sample_rate
    return torch.stack([start_s, end_s], dim=-1).unsqueeze(0)  # [1, T, 2]


def _frequencies(dim: int, num_axes: int, theta: float, double_precision: bool) -> torch.Tensor:
    freqs_dtype = torch.float64 if double_precision else torch.float32
    steps = torch.linspace(0.0, 1.0, steps=dim // (2 * num_axes), dtype=freqs_dtype)
    return (torch.pow(theta, steps) * math.pi / 2.0).to(torch.float32)


def rope_tables(
    coords: torch.Tensor,
    dim: int,
    max_positions: tuple[float, ...],
    theta: float,
    double_precision: bool,
    rope_type: str,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of `coords` [P, T, 2] (or positions [P, T]) for features of width `dim`."""
    if coords.dim() == 3:
        start, end = coords.chunk(2, dim=-1)
        coords = ((start + end) / 2.0).squeeze(-1)  # [P, T] patch midpoints
    num_axes = coords.shape[0]
    grid = torch.stack([coords[i] / max_positions[i] for i in range(num_axes)], dim=-1)  # [T, P]
    freqs = _frequencies(dim, num_axes, theta, double_precision)
    angles = (grid.unsqueeze(-1) * 2 - 1) * freqs  # [T, P, F]
    angles = angles.transpose(-1, -2).flatten(1)  # [T, F * P], frequency-major
    return _layout(angles, dim, num_axes, rope_type, num_heads)


def _layout(
    angles: torch.Tensor, dim: int, num_axes: int, rope_type: str, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if rope_type == INTERLEAVED:
        cos = angles.cos().repeat_interleave(2, dim=-1)
        sin = angles.sin().repeat_interleave(2, dim=-1)
        num_pad = dim % (2 * num_axes)
        if num_pad:  # features with no frequency pass through unrotated (cos 1, sin 0)
            cos = torch.cat([torch.ones_like(cos[:, :num_pad]), cos], dim=-1)
            sin = torch.cat([torch.zeros_like(sin[:, :num_pad]), sin], dim=-1)
        return cos, sin  # [T, dim]
    if rope_type == SPLIT:
        cos, sin = angles.cos(), angles.sin()
        num_pad = dim // 2 - angles.shape[-1]
        if num_pad:
            cos = torch.cat([torch.ones_like(cos[:, :num_pad]), cos], dim=-1)
            sin = torch.cat([torch.zeros_like(sin[:, :num_pad]), sin], dim=-1)
        num_tokens = cos.shape[0]
        return cos.reshape(num_tokens, num_heads, -1), sin.reshape(num_tokens, num_heads, -1)
    raise ValueError(f"rope_type must be '{INTERLEAVED}' or '{SPLIT}', got '{rope_type}'")


def connector_positions(seq_len: int) -> torch.Tensor:
    """[1, T] positions of the text connectors' 1-D rotary (rope_tables divides by the base length)."""
    return torch.arange(seq_len, dtype=torch.float32).unsqueeze(0)


def apply_rotary(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate x [T, dim] (model dtype) with tables from rope_tables; the rotation runs in float32
    and the result has x's dtype, as diffusers' apply_{interleaved,split}_rotary_emb."""
    cos, sin = tables
    if cos.dim() == 2:
        real, imag = x.unflatten(-1, (-1, 2)).unbind(-1)
        rotated = torch.stack([-imag, real], dim=-1).flatten(-2)
        return (x.float() * cos + rotated.float() * sin).to(x.dtype)
    num_tokens, num_heads, half = cos.shape
    # Each half written once from both halves (no in-place slice updates): the compiled step then
    # reads x once and writes the result once, in one kernel per tensor.
    first, second = x.reshape(num_tokens, num_heads, 2, half).float().unbind(-2)
    rotated = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-2)
    return rotated.reshape(num_tokens, -1).to(x.dtype)
