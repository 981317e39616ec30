"""Real Wan2.2-TI2V-5B VAE decoder (random weights) on a GPU: quality vs diffusers fp32, and timings.

Run: pytest -m gpu -s tests/models/wan22/test_vae_gpu.py
MSTAR_VAE_COMPILE_MODES picks the compile modes timed (comma-separated; default "deterministic").
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


def _fast_runner(decoder_fp32, compile_mode: str) -> VaeDecodeRunner:
    decoder = copy.deepcopy(decoder_fp32).to(torch.bfloat16)
    return VaeDecodeRunner(decoder, compile_mode=compile_mode, channels_last=True)


def test_decode_832x480x33_vs_diffusers_fp32(decoder_fp32, latents):
    diffusers = pytest.importorskip("diffusers")
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(WAN22_TI2V_5B_VAE_CONFIG).items()}
    with torch.device("meta"):
        reference = diffusers.AutoencoderKLWan(**fields)
    reference = reference.to_empty(device="cuda").eval().requires_grad_(False)
    reference.decoder.load_state_dict(decoder_fp32.decoder.state_dict())
    reference.post_quant_conv.load_state_dict(decoder_fp32.post_quant_conv.state_dict())

    with torch.inference_mode():
        expected_video, reference_s = _timed(lambda: reference.decode(latents).sample, repeats=2)
    expected = to_uint8_frames(expected_video)[0]
    del expected_video
    plain = VaeDecodeRunner(decoder_fp32, compile_mode="off", channels_last=False)
    plain_frames, plain_s = _timed(lambda: plain.decode_plain_uint8(latents), repeats=2)
    print(f"\ndiffusers fp32 decode {reference_s:.3f}s; ours plain fp32 {plain_s:.3f}s, "
          f"PSNR {_psnr_db(plain_frames, expected):.1f} dB")  # fmt: skip
    assert plain_frames.shape == (33, 480, 832, 3)
    assert _psnr_db(plain_frames, expected) >= 60.0
    for mode in _compile_modes():
        runner = _fast_runner(decoder_fp32, mode)
        compile_s = _first_call_s(lambda runner=runner: runner.decode_fast_uint8(latents))
        frames, fast_s = _timed(lambda runner=runner: runner.decode_fast_uint8(latents))
        psnr = _psnr_db(frames, expected)
        print(f"ours fast bf16 channels_last compile={mode}: first call {compile_s:.1f}s, "
              f"steady {fast_s:.3f}s, PSNR vs diffusers fp32 {psnr:.1f} dB")  # fmt: skip
        assert frames.shape == (33, 480, 832, 3) and frames.device.type == "cuda"
        assert psnr >= 30.0


def test_decode_paths_timing(decoder_fp32, latents):
    """Plain eager bf16 vs the fast path, for a 33-frame clip and a single image (no diffusers)."""
    image_latents = latents[:, :, :1].contiguous()
    plain = VaeDecodeRunner(copy.deepcopy(decoder_fp32).to(torch.bfloat16), channels_last=False)
    _, plain_clip_s = _timed(lambda: plain.decode_plain_uint8(latents))
    _, plain_image_s = _timed(lambda: plain.decode_plain_uint8(image_latents))
    print(f"\nplain eager bf16: clip {plain_clip_s:.3f}s, image {plain_image_s:.3f}s")
    for mode in ["off", *_compile_modes()]:
        runner = _fast_runner(decoder_fp32, mode)
        _first_call_s(lambda runner=runner: runner.decode_fast_uint8(latents))
        _first_call_s(lambda runner=runner: runner.decode_fast_uint8(image_latents))
        runner.finish_warmup()
        frames, clip_s = _timed(lambda runner=runner: runner.decode_fast_uint8(latents))
        _, image_s = _timed(lambda runner=runner: runner.decode_fast_uint8(image_latents))
        print(f"fast bf16 channels_last compile={mode}: clip {clip_s:.3f}s, image {image_s:.3f}s, "
              f"recompiles after warmup {runner.num_recompiles}")  # fmt: skip
        assert frames.shape == (33, 480, 832, 3)
        assert runner.num_recompiles == 0
        del runner
        torch.cuda.empty_cache()
