"""tiny-digits' request geometry, torch-free: latent shape, tokens, labels (guidance rule), step cost.

Images are one-frame videos in pixel space (no VAE): latents [channels, 1, image_size, image_size],
cut into patches by the DiT's patch size; the served image is upscaled from them. Guidance: a
second, "uncond" label when guidance_scale > 1 (as Wan's rule, the DiT being Wan's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mstar.graph import COND, UNCOND
from mstar.models.geometry import Segment


@dataclass(frozen=True)
class DigitsGeometry:
    num_channels: int
    image_size: int
    patch_size: tuple[int, int, int]
    max_text_tokens: int

    @classmethod
    def of(cls, shipped: dict[str, Any]) -> DigitsGeometry:
        """From weights/config.json's fields (TinyDigitsConfig's)."""
        return cls(
            shipped["num_channels"], shipped["image_size"], tuple(shipped["dit"]["patch_size"]),
            shipped["max_text_tokens"] + 1,  # <bos> and the prompt's words
        )  # fmt: skip

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """[C, F=1, H, W]: the one size the model makes."""
        return (self.num_channels, 1, self.image_size, self.image_size)

    @property
    def num_tokens(self) -> int:
        _, patch_h, patch_w = self.patch_size
        return (self.image_size // patch_h) * (self.image_size // patch_w)

    @staticmethod
    def labels(guidance_scale: float) -> tuple[str, ...]:
        return (COND, UNCOND) if guidance_scale > 1.0 else (COND,)

    def step_tokens(self, guidance_scale: float) -> int:
        return self.num_tokens * len(self.labels(guidance_scale))

    def segments(self, guidance_scale: float) -> list[Segment]:
        return [Segment(self.num_tokens, self.max_text_tokens)] * len(self.labels(guidance_scale))
