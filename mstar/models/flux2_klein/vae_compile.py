"""FLUX.2's VAE as served when compiling: the decode (final latents -> uint8 frames) and the
reference images' encode (pixels -> latents), each compiled with static shapes (one graph per size)
and checked against its eager function per size (mstar.engine.checked_compile.CheckedFunction):
inline at boot warmup for the configured sizes, on the compile thread for any other size, which
runs eagerly meanwhile and is swapped in once its check passed (a size whose compiled output
disagrees stays eager). Both return None for compile mode "off": the pipeline calls the eager
functions.

    decoder = checked_decode(vae, "deterministic")      # decoder(latents [128, h, w]) -> uint8 frames
    encoder = checked_encode(vae_encoder, "deterministic")  # encoder(pixels [1, 3, H, W]) -> latents
"""

from __future__ import annotations

import torch

from mstar.diffusion.noise import seeded_noise

# The encode's check compares float latents (SNR), not uint8 frames: in bf16 the compiled kernels
# round differently from eager (fused norms keep fp32 between ops), well above this; a miscompile
# lands near 0 dB.
ENCODE_MIN_SNR_DB = 30.0


def as_inference_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous inference-mode tensor: dynamo guards on dispatch keys, and the loop's final
    latents are not inference tensors while warmup's are (a recompile for that difference alone)."""
    if tensor.is_inference() and tensor.is_contiguous():
        return tensor
    with torch.inference_mode():
        return tensor.clone(memory_format=torch.contiguous_format)


def seeded_pixels(shape: tuple[int, ...], seed: int, device, dtype: torch.dtype) -> torch.Tensor:
    """Seeded uniform pixels in [-1, 1] (an encoder's input range; flat images would hide a miscompile)."""
    generator = torch.Generator("cpu").manual_seed(int(seed))
    return (torch.rand(shape, generator=generator) * 2 - 1).to(device, dtype)


def checked_decode(vae, compile_mode: str, compiler=None):
    """`vae.decode_frames` (latents [128, h, w] float32 -> uint8 [1, H, W, 3]) compiled and checked
    per latent size (h, w) against the eager decode (uint8 PSNR); None for compile mode "off"."""
    if compile_mode == "off":
        return None
    from mstar.diffusion.vae_decode import VAE_INDUCTOR_OPTIONS
    from mstar.engine.checked_compile import CheckedFunction
    from mstar.engine.compile import CompiledFunction

    compiled = CompiledFunction(
        vae.decode_frames, compile_mode, "flux2_vae_decode", dynamic=False, extra_options=VAE_INDUCTOR_OPTIONS
    )
    device = next(vae.parameters()).device

    def example(size: tuple[int, int]) -> tuple[torch.Tensor]:
        return (seeded_noise((vae.config.patchified_channels, *size), seed=0, device=device),)

    return CheckedFunction(
        "flux2_vae_decode", lambda latents: compiled(as_inference_tensor(latents)), vae.decode_frames,
        key=lambda latents: tuple(latents.shape[-2:]), example=example, parts=[compiled], compiler=compiler,
    )  # fmt: skip


def checked_encode(encoder, compile_mode: str, compiler=None):
    """`encoder.encode` (pixels [1, 3, H, W] in [-1, 1], the encoder's dtype -> latents
    [1, 128, H/16, W/16] float32) compiled and checked per pixel shape against the eager encode
    (SNR of the latents); None for compile mode "off"."""
    if compile_mode == "off":
        return None
    from mstar.diffusion.vae_decode import VAE_INDUCTOR_OPTIONS
    from mstar.engine.checked_compile import CheckedFunction, snr_db
    from mstar.engine.compile import CompiledFunction

    compiled = CompiledFunction(
        encoder.encode, compile_mode, "flux2_vae_encode", dynamic=False, extra_options=VAE_INDUCTOR_OPTIONS
    )
    weight = next(encoder.parameters())

    def example(shape: tuple[int, ...]) -> tuple[torch.Tensor]:
        return (seeded_pixels(shape, seed=0, device=weight.device, dtype=weight.dtype),)

    return CheckedFunction(
        "flux2_vae_encode", lambda pixels: compiled(as_inference_tensor(pixels)), encoder.encode,
        key=lambda pixels: tuple(pixels.shape), example=example, parts=[compiled], compare=snr_db,
        compiler=compiler, min_psnr_db=ENCODE_MIN_SNR_DB,
    )  # fmt: skip
