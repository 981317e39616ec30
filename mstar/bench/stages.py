"""Z-Image-Turbo's work outside the DiT, stage by stage: prompt encoding (Qwen3-4B), the VAE decode
of one 1024x1024 image (eager, channels-last, compiled) and the PNG encode of the result.

    python -m mstar.bench.stages -o bench-results/stages.json

Real shapes, seeded random weights. A diagnostic for speed work: the serving figures come from
`mstar bench serve-suite`. Each decode path is checked against the float32 decode (PSNR of uint8).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

PROMPT = "a red fox in fresh snow at dawn, soft light, detailed fur, shallow depth of field"
PNG_COMPRESS_LEVELS = (6, 1)


def _cuda_ms(fn, num_timed: int) -> float:
    from mstar.bench.step import time_forward

    return time_forward(fn, num_warmup=1, num_timed=num_timed, device="cuda")["median_ms"]


def time_text_encoder(num_timed: int) -> dict[str, Any]:
    import torch

    from mstar.models.text_fallback import load_tokenizer
    from mstar.models.zimage.config import REAL
    from mstar.models.zimage.text_encoder import Qwen3PromptEncoder, build_qwen3

    model = build_qwen3(REAL.text_encoder, "cuda", torch.bfloat16)
    tokenizer = load_tokenizer(None, REAL.text_encoder["vocab_size"], REAL.max_sequence_length, add_eos=False)
    encoder = Qwen3PromptEncoder(model, tokenizer, "cuda", REAL.max_sequence_length)
    with torch.inference_mode():
        ms = _cuda_ms(lambda: encoder.encode([PROMPT]), num_timed)
        num_tokens = encoder.encode([PROMPT])[0].shape[0]
    return {"text_encoder_ms": ms, "num_prompt_tokens": num_tokens}


def time_vae_paths(num_timed: int, compile_mode: str) -> dict[str, Any]:
    import torch

    from mstar.engine.checked_compile import uint8_psnr_db
    from mstar.engine.compile import inductor_options
    from mstar.models.zimage.config import REAL
    from mstar.models.zimage.weights import build_vae_decoder

    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(REAL.vae.latent_channels, 128, 128, generator=generator).cuda()
    reference_vae = build_vae_decoder(REAL.vae, "cuda", torch.float32)
    with torch.inference_mode():
        reference = reference_vae.decode_frames(latents)
    del reference_vae
    vae = build_vae_decoder(REAL.vae, "cuda", torch.bfloat16)
    results: dict[str, Any] = {}

    def record(label: str, fn) -> None:
        with torch.inference_mode():
            frames = fn(latents)
            results[f"vae_{label}_ms"] = _cuda_ms(lambda: fn(latents), num_timed)
            results[f"vae_{label}_psnr_db"] = uint8_psnr_db(frames, reference)

    record("eager", vae.decode_frames)
    vae = vae.to(memory_format=torch.channels_last)
    record("channels_last", lambda z: vae.decode_frames(z))
    compiled = torch.compile(
        vae.decode_frames,
        dynamic=False,
        options=inductor_options(compile_mode) | {"comprehensive_padding": False},
    )
    start = time.perf_counter()
    with torch.inference_mode():
        compiled(latents)
    torch.cuda.synchronize()
    results["vae_compile_s"] = time.perf_counter() - start
    record(f"compiled_{compile_mode}", compiled)
    results["frame"] = reference.cpu().numpy()[0]  # for the PNG timing; dropped before writing
    return results


def time_png(frame, num_timed: int) -> dict[str, Any]:
    from PIL import Image

    image = Image.fromarray(frame, mode="RGB")
    results = {}
    for level in PNG_COMPRESS_LEVELS:
        times, size = [], 0
        for _ in range(num_timed):
            buffer = io.BytesIO()
            start = time.perf_counter()
            image.save(buffer, format="PNG", compress_level=level)
            times.append((time.perf_counter() - start) * 1000)
            size = buffer.tell()
        results[f"png_level{level}_ms"] = median(times)
        results[f"png_level{level}_bytes"] = size
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mstar.bench.stages", description=__doc__)
    parser.add_argument("--num-timed", type=int, default=10)
    parser.add_argument("--compile-mode", default="deterministic")
    parser.add_argument("-o", "--output", default="bench-results/stages.json")
    args = parser.parse_args(argv)
    from mstar.bench.env import env_info

    results: dict[str, Any] = {"env": env_info(sys.argv)}
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    for name, fn in (
        ("text", lambda: time_text_encoder(args.num_timed)),
        ("vae", lambda: time_vae_paths(args.num_timed, args.compile_mode)),
    ):
        try:
            results.update(fn())
        except Exception as error:  # keep what the other stages measured
            results[f"{name}_error"] = f"{type(error).__name__}: {error}"
        frame = results.pop("frame", None)
        if frame is not None:
            results.update(time_png(frame, args.num_timed))
        output.write_text(json.dumps(results, indent=2, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "env"}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
