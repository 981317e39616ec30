"""Real Wan2.2-TI2V-5B VAE decoder (random weights) on a GPU: quality vs diffusers fp32, and timings.

Run: pytest -m gpu -s tests/models/wan22/test_vae_gpu.py   (diffusers optional: the fp32 reference)
MSTAR_VAE_COMPILE_MODES: compile modes timed besides "off" (comma-separated; default "deterministic").
MSTAR_VAE_CHUNK_FRAMES: latent frames per fast-path step (comma-separated; default "1,4").
"""

import copy
import math
import os
import time

import pytest
import torch

from mstar.diffusion.vae_decode import VaeDecodeRunner, to_uint8_frames
from mstar.models.wan22.vae import WanVAEDecoder
from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG

pytestmark = pytest.mark.gpu

LATENT_SHAPE = (1, 48, 9, 30, 52)  # 33 frames at 480x832
IMAGE_LATENT_SHAPE = (1, 48, 1, 30, 52)


def _compile_modes() -> list[str]:
    return [
        m.strip() for m in os.environ.get("MSTAR_VAE_COMPILE_MODES", "deterministic").split(",") if m.strip()
    ]


def _psnr_db(frames: torch.Tensor, reference: torch.Tensor) -> float:
    mse = (frames.float() - reference.float()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _timed(fn, repeats: int = 3):
    """(last result, best wall seconds over `repeats` synchronised calls)."""
    best_s = math.inf
    result = None
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        best_s = min(best_s, time.perf_counter() - start)
    return result, best_s


def _first_call_s(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def decoder_fp32():
    torch.manual_seed(0)
    with torch.device("cuda"):
        decoder = WanVAEDecoder(WAN22_TI2V_5B_VAE_CONFIG)
    return decoder.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def latents():
    return torch.randn(LATENT_SHAPE, generator=torch.Generator().manual_seed(1)).cuda()


def _chunk_sizes() -> list[int]:
    return [int(n) for n in os.environ.get("MSTAR_VAE_CHUNK_FRAMES", "1,4").split(",") if n.strip()]


def _diffusers_frames(decoder_fp32, latents):
    """(uint8 frames, best seconds) of diffusers' fp32 decode with our weights, or None without diffusers."""
    try:
        import diffusers
    except ImportError:
        return None
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(WAN22_TI2V_5B_VAE_CONFIG).items()}
    with torch.device("meta"):
        reference = diffusers.AutoencoderKLWan(**fields)
    reference = reference.to_empty(device="cuda").eval().requires_grad_(False)
    reference.decoder.load_state_dict(decoder_fp32.decoder.state_dict())
    reference.post_quant_conv.load_state_dict(decoder_fp32.post_quant_conv.state_dict())
    with torch.inference_mode():
        video, seconds = _timed(lambda: reference.decode(latents).sample, repeats=2)
    return to_uint8_frames(video)[0], seconds


def test_decode_832x480x33_quality_and_timing(decoder_fp32, latents):
    """Reference: diffusers fp32 when importable (else our plain fp32). One test, so each compile runs once."""
    image_latents = latents[:, :, :1].contiguous()
    plain = VaeDecodeRunner(decoder_fp32, compile_mode="off", channels_last=False)
    plain_frames, plain_s = _timed(lambda: plain.decode_plain_uint8(latents), repeats=2)
    assert plain_frames.shape == (33, 480, 832, 3) and plain_frames.device.type == "cuda"
    reference = _diffusers_frames(decoder_fp32, latents)
    if reference is None:
        print(f"\n(no diffusers: reference = our plain fp32 decode, {plain_s:.3f}s)")
        expected = plain_frames
    else:
        expected, reference_s = reference
        plain_psnr = _psnr_db(plain_frames, expected)
        print(
            f"\ndiffusers fp32 {reference_s:.3f}s; ours plain fp32 {plain_s:.3f}s, PSNR {plain_psnr:.1f} dB"
        )
        assert plain_psnr >= 60.0
    torch.cuda.empty_cache()
    _time_plain_bf16(decoder_fp32, latents, image_latents, expected)
    for mode in ["off", *_compile_modes()]:
        for chunk in _chunk_sizes():
            torch._dynamo.reset()  # fresh compile caches: each configuration compiles from scratch
            torch.cuda.reset_peak_memory_stats()
            _time_fast_path(decoder_fp32, latents, image_latents, expected, mode, chunk)
            torch.cuda.empty_cache()


def _time_plain_bf16(decoder_fp32, latents, image_latents, expected) -> None:
    bf16 = VaeDecodeRunner(copy.deepcopy(decoder_fp32).to(torch.bfloat16), channels_last=False)
    frames, clip_s = _timed(lambda: bf16.decode_plain_uint8(latents))
    _, image_s = _timed(lambda: bf16.decode_plain_uint8(image_latents))
    print(
        f"plain eager bf16: clip {clip_s:.3f}s, image {image_s:.3f}s, PSNR {_psnr_db(frames, expected):.1f} dB"
    )


def _time_fast_path(decoder_fp32, latents, image_latents, expected, mode: str, chunk: int) -> None:
    decoder = copy.deepcopy(decoder_fp32).to(torch.bfloat16)
    runner = VaeDecodeRunner(decoder, compile_mode=mode, channels_last=True, chunk_latent_frames=chunk)
    warmup_s = _first_call_s(lambda: runner.decode_fast_uint8(latents))
    warmup_s += _first_call_s(lambda: runner.decode_fast_uint8(image_latents))
    runner.finish_warmup()
    frames, clip_s = _timed(lambda: runner.decode_fast_uint8(latents))
    _, image_s = _timed(lambda: runner.decode_fast_uint8(image_latents))
    psnr = _psnr_db(frames, expected)
    peak_gib = torch.cuda.max_memory_allocated() / 2**30
    print(f"fast bf16 channels_last compile={mode} chunk={chunk}: warmup {warmup_s:.1f}s, clip {clip_s:.3f}s, "
          f"image {image_s:.3f}s, PSNR {psnr:.1f} dB, peak {peak_gib:.1f} GiB, "
          f"recompiles {runner.num_recompiles}")  # fmt: skip
    assert frames.shape == (33, 480, 832, 3) and frames.dtype == torch.uint8
    assert psnr >= 30.0
    assert runner.num_recompiles == 0
