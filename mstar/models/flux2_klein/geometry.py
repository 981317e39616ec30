"""FLUX.2 [klein] geometry, as Flux2KleinPipeline computes it: latent shapes, token counts of the
output and of each reference image, the text token count, the guidance labels, the schedule's mu
and the step cost. Torch-free: the spec, the nodes, the bench and the FLOP counter all read it.

Sizes. The VAE has spatial scale 8 and its latents are patchified 2x2 into 4x the channels, so
one transformer token covers a 16x16 pixel patch: an output of H x W pixels is a latent grid
[128, H // 16, W // 16] (klein's 128 = 4 x 32 VAE channels), (H // 16) * (W // 16) tokens.
Reference images are resized to at most 1024 x 1024 pixels of area, cropped to multiples of 16
and encoded the same way; each adds its own grid of tokens. The prompt is always padded to
max_sequence_length tokens (512), and the transformer attends to all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mstar.models.geometry import Segment

COND, UNCOND = "cond", "uncond"  # the labels of mstar.diffusion.denoise

PATCH_SIZE = 2  # the pipeline's 2x2 latent patchify (VAE patch_size)
REFERENCE_MAX_AREA = 1024 * 1024  # pixels; larger reference images are scaled down to this area
REFERENCE_MIN_SIDE = 64  # Flux2ImageProcessor.check_image_input
REFERENCE_MAX_ASPECT_RATIO = 8
MAX_REFERENCE_IMAGES = 4  # BFL's documented limit for FLUX.2 [klein] 4B and 9B (the pipeline sets none)
REFERENCE_TIME_STEP = 10  # reference image i sits at rotary time coordinate 10 + 10 * i
DEFAULT_SIZE = 1024  # the pipeline's default_sample_size 128 x vae scale 8
# The pipeline's call defaults. The distilled checkpoints' model cards run 4 steps (guidance off).
DEFAULT_NUM_STEPS = 50
DEFAULT_GUIDANCE_SCALE = 4.0
DISTILLED_NUM_STEPS = 4


def pixel_granularity(vae_scale: int = 8) -> int:
    """Output sizes are floored to multiples of this many pixels (vae scale x patch 2)."""
    return vae_scale * PATCH_SIZE


def latent_grid(height: int, width: int, vae_scale: int = 8) -> tuple[int, int]:
    """(rows, cols) of the patchified latent grid of an H x W pixel image: one token per cell."""
    cell = pixel_granularity(vae_scale)
    return height // cell, width // cell


def num_image_tokens(height: int, width: int, vae_scale: int = 8) -> int:
    rows, cols = latent_grid(height, width, vae_scale)
    return rows * cols


def output_pixel_size(height: int, width: int, vae_scale: int = 8) -> tuple[int, int]:
    """(height, width) of the decoded image: the request's size floored to the granularity."""
    rows, cols = latent_grid(height, width, vae_scale)
    cell = pixel_granularity(vae_scale)
    return rows * cell, cols * cell


def reference_scaled_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) of a reference image after the pipeline's area cap: scaled (Lanczos) to
    REFERENCE_MAX_AREA when larger, unchanged otherwise."""
    if width * height <= REFERENCE_MAX_AREA:
        return width, height
    scale = math.sqrt(REFERENCE_MAX_AREA / (width * height))
    return int(width * scale), int(height * scale)


def reference_pixel_size(width: int, height: int, vae_scale: int = 8) -> tuple[int, int]:
    """(width, height) a reference image is encoded at: the area-capped size center-cropped to
    multiples of the granularity, as the pipeline does."""
    width, height = reference_scaled_size(width, height)
    cell = pixel_granularity(vae_scale)
    return (width // cell) * cell, (height // cell) * cell


def reference_size_error(width: int, height: int) -> str | None:
    """Why the pipeline refuses a reference image of this size, or None when it takes it."""
    if width < REFERENCE_MIN_SIDE or height < REFERENCE_MIN_SIDE:
        return f"image is {width}x{height}; both sides must be at least {REFERENCE_MIN_SIDE} pixels"
    if max(width / height, height / width) > REFERENCE_MAX_ASPECT_RATIO:
        return f"image is {width}x{height}; the aspect ratio must be at most {REFERENCE_MAX_ASPECT_RATIO}:1"
    return None


def warmup_reference_size(width: int, height: int) -> tuple[int, int] | None:
    """(width, height) of the boot warmup's reference images at a configured output size: the
    output's own size (an edit's references are commonly as large as its output), raised to the
    pipeline's minimum side; None where the pipeline would refuse it (beyond the aspect limit)."""
    size = max(width, REFERENCE_MIN_SIDE), max(height, REFERENCE_MIN_SIDE)
    return None if reference_size_error(*size) is not None else size


def default_output_size(reference_sizes: list[tuple[int, int]]) -> tuple[int, int]:
    """(height, width) when the request names none: the first reference image's encoded size
    (the pipeline's `height = height or image_height`), else 1024 x 1024."""
    if reference_sizes:
        width, height = reference_pixel_size(*reference_sizes[0])
        return height, width
    return DEFAULT_SIZE, DEFAULT_SIZE


def uses_guidance(guidance_scale: float, is_distilled: bool) -> bool:
    """Classifier-free guidance (a second, unconditional label) runs when guidance_scale > 1 and
    the checkpoint is not step-distilled; the distilled ones ignore guidance_scale."""
    return guidance_scale > 1.0 and not is_distilled


def guidance_labels(guidance_scale: float, is_distilled: bool) -> tuple[str, ...]:
    return (COND, UNCOND) if uses_guidance(guidance_scale, is_distilled) else (COND,)


def empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """The schedule's time-shift mu (the pipeline's compute_empirical_mu, from BFL's sampler): a
    fit in the output's token count and the step count (only the token count above 4300)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    b = m_200 - 200.0 * a
    return float(a * num_steps + b)


@dataclass(frozen=True)
class StepTokens:
    """Token counts of one (request, label) in a DiT step."""

    num_text: int
    num_output: int
    num_reference: tuple[int, ...] = ()

    @property
    def num_image(self) -> int:
        """Image-stream tokens: the output's and every reference image's."""
        return self.num_output + sum(self.num_reference)

    @property
    def num_tokens(self) -> int:
        """The joint attention segment of this label: text, output and reference tokens."""
        return self.num_text + self.num_image


def step_tokens(
    height: int,
    width: int,
    reference_sizes: list[tuple[int, int]] = (),
    max_sequence_length: int = 512,
    vae_scale: int = 8,
) -> StepTokens:
    """One label's tokens for an H x W output with reference images given as (width, height)."""
    references = tuple(
        num_image_tokens(ref_h, ref_w, vae_scale)
        for ref_w, ref_h in (reference_pixel_size(w, h, vae_scale) for w, h in reference_sizes)
    )
    return StepTokens(max_sequence_length, num_image_tokens(height, width, vae_scale), references)


def step_cost_tokens(tokens: StepTokens, num_labels: int) -> int:
    """Tokens a request adds to a packed DiT step (every label is its own segment)."""
    return tokens.num_tokens * num_labels


@dataclass(frozen=True)
class Flux2KleinGeometry:
    """The geometry of one checkpoint (its VAE scale, prompt length and guidance rule), as the
    spec, the pipeline, the bench and the FLOP counter read it."""

    vae_scale: int
    max_sequence_length: int
    is_distilled: bool

    @classmethod
    def of(cls, config) -> Flux2KleinGeometry:
        """config: a Flux2KleinConfig (not imported here: the config module is light, but this keeps
        the geometry free of it)."""
        return cls(config.vae.spatial_scale, config.max_sequence_length, config.is_distilled)

    @property
    def size_multiple(self) -> int:
        return pixel_granularity(self.vae_scale)

    def latent_grid(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of an output of width x height pixels."""
        return latent_grid(height, width, self.vae_scale)

    def labels(self, guidance_scale: float) -> tuple[str, ...]:
        return guidance_labels(guidance_scale, self.is_distilled)

    def tokens(self, width: int, height: int, reference_sizes=()) -> StepTokens:
        """One label's tokens; reference_sizes: (width, height) of each reference as uploaded."""
        return step_tokens(height, width, list(reference_sizes), self.max_sequence_length, self.vae_scale)

    def step_tokens(self, width: int, height: int, guidance_scale: float, reference_sizes=()) -> int:
        """The most a request adds to one step: its joint tokens times its labels."""
        tokens = self.tokens(width, height, reference_sizes)
        return step_cost_tokens(tokens, len(self.labels(guidance_scale)))

    def segments(self, width: int, height: int, guidance_scale: float, reference_sizes=()) -> list[Segment]:
        """The request's segments of a packed step (one per label): image tokens (output and
        references) and the padded prompt."""
        tokens = self.tokens(width, height, reference_sizes)
        return [Segment(tokens.num_image, tokens.num_text)] * len(self.labels(guidance_scale))
