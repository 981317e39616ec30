"""What every family's geometry.py speaks in: the token segments of one packed step.

A family's geometry (torch-free, `models/<family>/geometry.py`) turns a request's size into its
latent shape, its tokens per step, its labels (the guidance rule) and its step cost, and is read by
the spec (validation's token cap), the pipeline (latents, step cost), the bench (workload shapes)
and the FLOP counter (`segments`) alike, so no formula is written twice.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """One (request, label) in a packed forward: its latent tokens and its text tokens."""

    image_tokens: int
    text_tokens: int


def padded(num_tokens: int, multiple: int) -> int:
    """`num_tokens` rounded up to a multiple of `multiple`."""
    return num_tokens + (-num_tokens) % multiple
