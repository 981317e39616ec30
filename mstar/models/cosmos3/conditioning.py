"""Initial latents and the image-to-video condition, as Cosmos3OmniPipeline.prepare_latents makes them.

    image = preprocess_image(uint8_hwc, height=480, width=832)        # [1, 3, 480, 832] in [-1, 1]
    image_latents = encode_image(vae_encoder, image)                  # [C, 1, h, w], normalised
    latents = initial_latents(latent_shape, seed, image_latents)      # float32 [C, F, h, w]

Noise is drawn as diffusers draws it (a CPU generator seeded with the request's seed, float32), so
a seed means the same thing here and there. Image-to-video keeps latent frame 0 as the encoded
image: the pipeline encodes the image repeated over the whole clip, but the Wan VAE is causal in
time and its first latent frame reads only the first video frame, so encoding the image alone
gives that frame at a fraction of the cost. The frame is clean at the first step only: the
sampler steps it with a zero velocity, as diffusers does (no re-anchoring).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from mstar.diffusion.noise import seeded_noise
from mstar.models.wan22.vae import normalize_latents


def _as_uint8_chw(image) -> torch.Tensor:
    """PIL image, uint8 array [H, W, 3] or uint8 tensor [3, H, W] -> float32 [1, 3, H, W] in 0..255."""
    if hasattr(image, "convert"):  # PIL
        image = np.array(image.convert("RGB"), copy=True)
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image).permute(2, 0, 1)
    if image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(f"the conditioning image must be one RGB image, got shape {tuple(image.shape)}")
    if image.dtype != torch.uint8:
        raise ValueError(f"the conditioning image must be uint8, got {image.dtype}")
    return image.unsqueeze(0).to(torch.float32)


def preprocess_image(image, height: int, width: int) -> torch.Tensor:
    """Cover-scale the image (ceil), antialiased bilinear resize, centre crop to height x width,
    round to 8 bits, map to [-1, 1]: float32 [1, 3, height, width] (the pipeline's preprocessing)."""
    pixels = _as_uint8_chw(image)
    source_height, source_width = pixels.shape[-2:]
    scale = max(width / source_width, height / source_height)
    resized = (math.ceil(scale * source_height), math.ceil(scale * source_width))
    pixels = F.interpolate(pixels, size=resized, mode="bilinear", align_corners=False, antialias=True)
    top = round((resized[0] - height) / 2)
    left = round((resized[1] - width) / 2)
    pixels = pixels[:, :, top : top + height, left : left + width]
    return pixels.round().clamp(0, 255) / 127.5 - 1.0


def encode_image(encoder, image: torch.Tensor) -> torch.Tensor:
    """[1, 3, H, W] in [-1, 1] -> the normalised latent mean of that one frame, float32 [C, 1, h, w].
    `encoder` is the Wan VAE (or its encoder-only copy)."""
    weight = next(encoder.parameters())
    raw = encoder.encode(image.unsqueeze(2).to(weight.device, weight.dtype))  # [1, C, 1, h, w]
    return normalize_latents(raw, encoder.config)[0].float()


def initial_latents(
    shape: tuple[int, int, int, int], seed: int, image_latents: torch.Tensor | None = None
) -> torch.Tensor:
    """float32 [C, F, h, w] seeded noise; with image_latents [C, 1, h, w], frame 0 is the image."""
    latents = seeded_noise(shape, seed)
    if image_latents is not None:
        if tuple(image_latents.shape) != (shape[0], 1, shape[2], shape[3]):
            raise ValueError(f"image latents {tuple(image_latents.shape)} do not fit latents {shape}")
        latents[:, :1] = image_latents.to(latents.device, latents.dtype)
    return latents
