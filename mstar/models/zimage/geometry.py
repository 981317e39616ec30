"""Z-Image's request geometry, torch-free: latent size, tokens, labels (guidance rule), step cost.

As ZImagePipeline: latents are [16, 2*(H//16), 2*(W//16)] (the VAE's 8x, rounded to the 2x2
patch); image tokens and caption tokens are each padded to a multiple of 32 (the DiT's inner pad
tokens, kept as diffusers keeps them); each label is image + its own caption. Guidance (the
pipeline's rule): a second, "uncond" label whenever guidance_scale > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from mstar.graph import COND, UNCOND
from mstar.models.geometry import Segment, padded
from mstar.models.zimage.config import ZImageConfig

SEQ_MULTI_OF = 32  # the DiT pads image and caption tokens to this multiple


def padded_len(num_tokens: int) -> int:
    return padded(num_tokens, SEQ_MULTI_OF)


@dataclass(frozen=True)
class ZImageGeometry:
    in_channels: int
    patch_size: int
    vae_scale: int  # pixels per latent cell along one side
    max_text_tokens: int

    @classmethod
    def of(cls, config: ZImageConfig) -> ZImageGeometry:
        return cls(
            config.dit.in_channels,
            config.dit.patch_size,
            config.vae.spatial_scale,
            config.max_sequence_length,
        )

    def latent_size(self, width: int, height: int) -> tuple[int, int]:
        """(h, w) latent cells of a width x height image."""
        return 2 * (height // (self.vae_scale * 2)), 2 * (width // (self.vae_scale * 2))

    def image_tokens(self, width: int, height: int) -> int:
        """The image's DiT tokens, padded."""
        h, w = self.latent_size(width, height)
        return padded_len((h // self.patch_size) * (w // self.patch_size))

    @staticmethod
    def labels(guidance_scale: float) -> tuple[str, ...]:
        return (COND, UNCOND) if guidance_scale > 0.0 else (COND,)

    def num_tokens(self, width: int, height: int, caption_tokens: list[int]) -> int:
        """Tokens one label adds to a step: the image plus the longest of the labels' captions
        (so the step cost never undercounts a long negative prompt)."""
        return self.image_tokens(width, height) + max(padded_len(n) for n in caption_tokens)

    def step_tokens(self, width: int, height: int, guidance_scale: float) -> int:
        """The most a request adds to one step: its captions at their longest, times its labels."""
        labels = self.labels(guidance_scale)
        return self.num_tokens(width, height, [self.max_text_tokens]) * len(labels)

    def segments(self, width: int, height: int, caption_tokens: int, guidance_scale: float) -> list[Segment]:
        """The request's segments of a packed step (one per label), the caption padded."""
        segment = Segment(self.image_tokens(width, height), padded_len(caption_tokens))
        return [segment] * len(self.labels(guidance_scale))
