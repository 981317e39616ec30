"""The real-size Z-Image VAE decode compiled at warmup (seeded random weights, bf16; the lead runs
this on an H200: about 20 s of compile)."""

import time

import pytest
import torch

from mstar.bench.step import time_forward
from mstar.config import CompileSize
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.vae_nodes import FRAMES, LATENTS, DecodeNode
from mstar.engine.checked_compile import COMPILED, PENDING
from mstar.graph import RequestState
from mstar.models.zimage.config import REAL
from mstar.models.zimage.nodes import checked_decode
from mstar.models.zimage.pipeline import ZImagePipeline
from mstar.models.zimage.weights import build_vae_decoder

pytestmark = pytest.mark.gpu


def test_warmup_compiles_1024_decode_that_matches_eager_and_is_faster():
    torch._dynamo.reset()
    vae = build_vae_decoder(REAL.vae, "cuda", torch.bfloat16)
    decode = checked_decode(vae, "deterministic")
    pipeline = ZImagePipeline(REAL, "cuda", vae=vae, decoder=decode)
    node = DecodeNode(pipeline, warmup_sizes=[CompileSize(width=1024, height=1024)])
    start = time.perf_counter()
    node.warmup()
    warmup_s = time.perf_counter() - start
    psnr_db = decode.checked.psnr_db[(128, 128)]
    assert decode.checked.state((128, 128)) == COMPILED and decode.parts[0].num_compiles == 1
    assert psnr_db >= 40.0

    latents = seeded_noise((REAL.vae.latent_channels, 128, 128), seed=7, device="cuda")
    request = RequestState("r", None)
    request.tensors[LATENTS] = latents.clone()
    node.forward([request])
    frames = request.tensors[FRAMES]
    assert frames.dtype == torch.uint8 and frames.shape == (1, 1024, 1024, 3) and frames.is_cuda
    assert node.num_recompiles() == 0
    with torch.inference_mode():
        eager_ms = time_forward(lambda: vae.decode_frames(latents), 2, 10, "cuda")["median_ms"]
        compiled_ms = time_forward(lambda: decode(latents), 2, 10, "cuda")["median_ms"]
    print(
        f"\nzimage VAE 1024x1024: warmup {warmup_s:.1f} s, compiled vs eager {psnr_db:.1f} dB, "
        f"eager {eager_ms:.1f} ms, compiled {compiled_ms:.1f} ms"
    )
    assert compiled_ms < eager_ms


def test_a_size_not_warmed_is_served_at_once_and_compiled_on_the_compile_thread():
    """On CUDA: the compile thread takes the worker's device, its compile is not a recompile, and
    the size is swapped in once checked."""
    torch._dynamo.reset()
    vae = build_vae_decoder(REAL.vae, "cuda", torch.bfloat16)
    decode = checked_decode(vae, "deterministic")
    pipeline = ZImagePipeline(REAL, "cuda", vae=vae, decoder=decode)
    node = DecodeNode(pipeline, warmup_sizes=[CompileSize(width=1024, height=1024)])
    node.warmup()
    latents = seeded_noise((REAL.vae.latent_channels, 168, 96), seed=3, device="cuda")  # 768x1344
    request = RequestState("r", None)
    request.tensors[LATENTS] = latents.clone()
    node.forward([request])
    assert request.tensors[FRAMES].shape == (1, 1344, 768, 3)
    assert decode.checked.state((168, 96)) == PENDING  # served before its compile finished
    assert decode.checked.compiler.wait_idle(600)
    assert decode.checked.state((168, 96)) == COMPILED and decode.checked.psnr_db[(168, 96)] >= 40.0
    assert node.num_recompiles() == 0 and decode.num_background_compiles == 1
