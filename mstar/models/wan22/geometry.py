"""Wan2.2's request geometry, torch-free: latent shape, tokens, labels (guidance rule), step cost.

Latents are [C, F', H', W'] with F' = (frames - 1) / 4 + 1 (the VAE's temporal 4x) and H', W' the
pixels over the VAE's spatial scale (16); the DiT patchifies them by patch_size (1, 2, 2). Text is
padded to max_text_tokens (512), as WanPipeline feeds the transformer. Guidance (WanPipeline's
rule): a second, "uncond" label when guidance_scale > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from mstar.graph import COND, UNCOND
from mstar.models.geometry import Segment
from mstar.models.wan22.config import Wan22Config


@dataclass(frozen=True)
class WanGeometry:
    in_channels: int
    patch_size: tuple[int, int, int]
    vae_scale_spatial: int
    vae_scale_temporal: int
    max_text_tokens: int

    @classmethod
    def of(cls, config: Wan22Config) -> WanGeometry:
        return cls(
            config.dit.in_channels,
            tuple(config.dit.patch_size),
            config.vae_scale_spatial,
            config.vae_scale_temporal,
            config.max_text_tokens,
        )

    def latent_shape(self, width: int, height: int, num_frames: int) -> tuple[int, int, int, int]:
        """[C, F', H', W'] latents of a width x height clip of num_frames frames."""
        num_latent_frames = (num_frames - 1) // self.vae_scale_temporal + 1
        return (
            self.in_channels,
            num_latent_frames,
            height // self.vae_scale_spatial,
            width // self.vae_scale_spatial,
        )

    def latent_tokens(self, latent_shape: tuple[int, ...]) -> int:
        """DiT tokens of latents [C, F', H', W']: patches of patch_size."""
        p_t, p_h, p_w = self.patch_size
        return (latent_shape[1] // p_t) * (latent_shape[2] // p_h) * (latent_shape[3] // p_w)

    def num_tokens(self, width: int, height: int, num_frames: int) -> int:
        return self.latent_tokens(self.latent_shape(width, height, num_frames))

    @staticmethod
    def labels(guidance_scale: float) -> tuple[str, ...]:
        return (COND, UNCOND) if guidance_scale > 1.0 else (COND,)

    def step_tokens(self, width: int, height: int, num_frames: int, guidance_scale: float) -> int:
        """What the request adds to one denoise step: its tokens times its labels."""
        return self.num_tokens(width, height, num_frames) * len(self.labels(guidance_scale))

    def segments(self, width: int, height: int, num_frames: int, guidance_scale: float) -> list[Segment]:
        """The request's segments of a packed step (one per label), text at its padded length."""
        segment = Segment(self.num_tokens(width, height, num_frames), self.max_text_tokens)
        return [segment] * len(self.labels(guidance_scale))
