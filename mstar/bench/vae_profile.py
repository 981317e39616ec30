"""Where a VAE decode's time goes, and which of its serving variants is fastest (diagnostic).

    python -m mstar.bench.vae_profile -o bench-results/vae_profile.json

Real shapes, seeded random weights, bf16, on CUDA:
- Z-Image 1024x1024 (one image): the served compiled decode (contiguous, its GroupNorms'
  statistics by pixel blocks), and the same with channels-last weights and input, each also with
  F.group_norm;
- Wan2.2 832x480x33 (one clip): the served fast path (channels_last_3d, compiled, one latent frame a
  chunk) and the same with 2 and 4 latent frames a chunk.
Each variant: ms a decode (CUDA events, median), PSNR of its uint8 frames against the served
variant's, and the kernel time by kind (convolution, GEMM, attention, triton, copies) with the top
kernels under torch.profiler. The serving figures come from `mstar bench serve-suite`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

CONV_PATTERNS = ("fprop", "implicit_gemm", "conv")  # cuDNN's forward convolution kernels
NUM_TOP_KERNELS = 12


def _kernel_summary(fn, num_profiled: int) -> dict[str, Any]:
    """summarize_kernels with cuDNN's convolutions (implicit GEMMs, in the "gemm" kind) also
    counted apart."""
    from mstar.bench.profile import kernel_events, summarize_kernels

    events = kernel_events(fn, num_profiled, "cuda")
    summary = summarize_kernels(events, num_profiled)
    conv_us = sum(us for name, us in events if is_convolution_kernel(name))
    summary["by_kind_ms"]["convolutions (within gemm)"] = conv_us / 1000 / num_profiled
    summary["top_kernels"] = summary["top_kernels"][:NUM_TOP_KERNELS]
    return summary


def is_convolution_kernel(name: str) -> bool:
    """cuDNN's convolution kernels; Triton's fused kernels name the convolution their inputs came
    from ("triton_red_fused_convolution_...") and are not counted."""
    lowered = name.lower()
    return not lowered.startswith("triton") and any(pattern in lowered for pattern in CONV_PATTERNS)


def _measure(label: str, fn, reference, num_timed: int, num_profiled: int) -> dict[str, Any]:
    import torch

    from mstar.bench.step import time_forward
    from mstar.engine.checked_compile import uint8_psnr_db

    start = time.perf_counter()
    with torch.inference_mode():
        frames = fn()
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - start

    def call() -> None:
        with torch.inference_mode():
            fn()

    timing = time_forward(call, num_warmup=2, num_timed=num_timed, device="cuda")
    return {
        "variant": label,
        "first_call_s": first_call_s,
        "median_ms": timing["median_ms"],
        "psnr_db_vs_served": None if reference is None else uint8_psnr_db(frames, reference),
        **_kernel_summary(call, num_profiled),
        "frames": frames,
    }


ZIMAGE_VARIANTS = (  # (label, channels-last, GroupNorm statistics by pixel blocks); the first is served
    ("zimage compiled, norms by pixel blocks (served)", False, True),
    ("zimage compiled channels-last, norms by pixel blocks", True, True),
    ("zimage compiled, F.group_norm", False, False),
    ("zimage compiled channels-last, F.group_norm", True, False),
)


def zimage_variants(num_timed: int, num_profiled: int, compile_mode: str) -> list[dict[str, Any]]:
    import torch

    from mstar.diffusion.vae_decode import VAE_INDUCTOR_OPTIONS
    from mstar.engine.compile import inductor_options
    from mstar.models.zimage.config import REAL
    from mstar.models.zimage.weights import build_vae_decoder

    latents = torch.randn(REAL.vae.latent_channels, 128, 128, generator=torch.Generator().manual_seed(0))
    latents = latents.cuda()
    vae = build_vae_decoder(REAL.vae, "cuda", torch.bfloat16)
    options = inductor_options(compile_mode) | VAE_INDUCTOR_OPTIONS
    rows: list[dict[str, Any]] = []
    for label, channels_last, block_norms in ZIMAGE_VARIANTS:
        torch._dynamo.reset()
        vae = vae.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        vae.use_pixel_block_norms(block_norms)
        compiled = torch.compile(vae.decode_frames, dynamic=False, options=options)
        reference = rows[0]["frames"] if rows else None
        rows.append(_measure(label, lambda c=compiled: c(latents), reference, num_timed, num_profiled))
    return rows


def wan_variants(num_timed: int, num_profiled: int, compile_mode: str, chunks: list[int]) -> list[dict]:
    import copy

    import torch

    from mstar.diffusion.vae_decode import VaeDecodeRunner
    from mstar.models.wan22.vae import WanVAEDecoder
    from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG

    torch.manual_seed(0)
    with torch.device("cuda"):
        decoder = WanVAEDecoder(WAN22_TI2V_5B_VAE_CONFIG).to(torch.bfloat16).eval().requires_grad_(False)
    latents = torch.randn(1, 48, 9, 30, 52, generator=torch.Generator().manual_seed(1)).cuda()
    rows: list[dict[str, Any]] = []
    for chunk in chunks:
        torch._dynamo.reset()
        runner = VaeDecodeRunner(copy.deepcopy(decoder), compile_mode=compile_mode, chunk_latent_frames=chunk)
        reference = rows[0]["frames"] if rows else None
        label = f"wan fast path, {chunk} latent frame(s) a chunk" + (" (served)" if not rows else "")
        rows.append(_measure(label, lambda r=runner: r.decode_fast_uint8(latents), reference, num_timed,
                             num_profiled))  # fmt: skip
        rows[-1]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        del runner
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mstar.bench.vae_profile", description=__doc__)
    parser.add_argument("--num-timed", type=int, default=10)
    parser.add_argument("--num-profiled", type=int, default=2)
    parser.add_argument("--compile-mode", default="deterministic")
    parser.add_argument("--wan-chunks", default="1,2,4", help="latent frames a chunk, comma-separated")
    parser.add_argument("--models", default="zimage,wan", help="zimage, wan or both")
    parser.add_argument("-o", "--output", default="bench-results/vae_profile.json")
    args = parser.parse_args(argv)
    from mstar.bench.env import env_info

    results: dict[str, Any] = {"env": env_info(sys.argv), "variants": []}
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    chunks = [int(n) for n in args.wan_chunks.split(",") if n.strip()]
    for name, run in (
        ("zimage", lambda: zimage_variants(args.num_timed, args.num_profiled, args.compile_mode)),
        ("wan", lambda: wan_variants(args.num_timed, args.num_profiled, args.compile_mode, chunks)),
    ):
        if name not in args.models.split(","):
            continue
        try:
            rows = run()
        except Exception as error:  # keep what the other model measured
            results[f"{name}_error"] = f"{type(error).__name__}: {error}"
            rows = []
        results["variants"] += [{k: v for k, v in row.items() if k != "frames"} for row in rows]
        output.write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "env"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
