"""Reference images for edits, prepared as Flux2KleinPipeline prepares them before the VAE
encoder: refused below 64 pixels a side or beyond an 8:1 aspect ratio, scaled (Lanczos) down to
1024 x 1024 pixels of area when larger, center-cropped to multiples of 16 pixels (the geometry's
granularity), converted to RGB and to [-1, 1]."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from mstar.models.flux2_klein.geometry import (
    reference_pixel_size,
    reference_scaled_size,
    reference_size_error,
)

if TYPE_CHECKING:
    from PIL import Image


def prepare_reference(image: Image.Image | np.ndarray, vae_scale: int = 8) -> torch.Tensor:
    """A PIL image (or uint8 RGB [H, W, 3], as mstar.api.media.decode_image gives) -> float32
    [3, h, w] in [-1, 1] on the host; ValueError (saying why) when the pipeline would refuse it."""
    from PIL import Image

    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    error = reference_size_error(*image.size)
    if error is not None:
        raise ValueError(error)
    scaled = reference_scaled_size(*image.size)
    if scaled != image.size:
        image = image.resize(scaled, Image.Resampling.LANCZOS)
    width, height = reference_pixel_size(*image.size, vae_scale=vae_scale)
    left, top = (image.width - width) // 2, (image.height - height) // 2
    image = image.crop((left, top, left + width, top + height)).convert("RGB")
    pixels = torch.from_numpy(np.array(image).astype(np.float32) / 255.0)  # [h, w, 3]
    return pixels.permute(2, 0, 1).contiguous() * 2.0 - 1.0
