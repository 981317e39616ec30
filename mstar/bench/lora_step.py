"""`python -m mstar.bench.lora_step`: a served Wan2.2 DiT step with per-request LoRA on this GPU.

Builds the Wan2.2-TI2V-5B DiT (seeded random weights, bf16) as the server does (optimize -> LoRA
layers -> compile), writes four rank-32 adapter files (every Linear the family takes LoRA on) into
a temporary lora_dir, loads them through the adapter store (the per-adapter load time: read,
convert, pack, copy to a slot) and times one packed step of four 832x480x33 requests with guidance
(8 segments) through the pipeline's predict: with four different adapters (one per request)
against the same pack without adapters. `--tiny` runs the tiny config on the CPU (a smoke test).
Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from types import SimpleNamespace

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem

RANK, NUM_REQUESTS = 32, 4
WIDTH, HEIGHT, NUM_FRAMES = 832, 480, 33


def _write_adapters(folder: str, dit, targets, rank: int) -> list[str]:
    from safetensors.torch import save_file

    sources = {piece.source: (piece.out_features, dit.get_submodule(t.module).in_features)
               for t in targets for piece in t.slices}  # fmt: skip
    names = []
    for index in range(NUM_REQUESTS):
        generator = torch.Generator().manual_seed(index)
        tensors = {}
        for module, (out_features, in_features) in sources.items():
            down = torch.randn(rank, in_features, generator=generator) / in_features**0.5
            tensors[f"transformer.{module}.lora_A.weight"] = down.to(torch.bfloat16)
            tensors[f"transformer.{module}.lora_B.weight"] = (0.01 * torch.randn(out_features, rank, generator=generator)).to(torch.bfloat16)  # fmt: skip
        names.append(f"bench-{index}")
        save_file(tensors, os.path.join(folder, f"{names[-1]}.safetensors"))
    return names


def _time_ms(fn, device: str, repeats: int) -> float:
    for _ in range(3):
        fn()
    if not device.startswith("cuda"):
        started = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - started)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def bench_wan(tiny: bool, device: str, repeats: int = 10) -> None:
    from mstar.engine.attention import build_attention
    from mstar.engine.compile import effective_mode
    from mstar.engine.lora.serving import attach_lora
    from mstar.models.scaffold import speed_up, speed_ups
    from mstar.models.wan22.config import Wan22Config, tiny_wan22_config
    from mstar.models.wan22.dit import WanDiT
    from mstar.models.wan22.lora import wan_lora_targets
    from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
    from mstar.models.wan22.optimize import optimize
    from mstar.models.wan22.pipeline import WanPipeline
    from mstar.params import LoraChoice

    config = tiny_wan22_config() if tiny else Wan22Config()
    width, height, frames = (32, 48, 5) if tiny else (WIDTH, HEIGHT, NUM_FRAMES)
    dtype = torch.float32 if tiny else torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        dit = WanDiT(config.dit)
    dit = dit.to(device, dtype).eval().requires_grad_(False)
    server = SimpleNamespace(fuse_projections=True, triton_kernels=True, compile_mode="deterministic")
    fuse, kernels = speed_ups(server, device)
    mode = effective_mode("deterministic", device) if not tiny else "off"
    with tempfile.TemporaryDirectory() as folder:
        lora_config = SimpleNamespace(lora_dir=folder, max_loras=NUM_REQUESTS, max_lora_rank=RANK,
                                      max_loras_per_request=1)  # fmt: skip
        holder = {}

        def wrap(model):
            holder["lora"] = attach_lora(model, wan_lora_targets, lora_config, WAN22_LORA_KEYS)

        dit, _ = speed_up(dit, optimize, fuse, kernels, mode, "bench.lora.wan", wrap=wrap)
        lora = holder["lora"]
        names = _write_adapters(folder, dit, lora.layers.targets, RANK)
        attention = build_attention("auto", device, dtype)
        pipeline = WanPipeline(config, device, dtype, dit=dit, attention=attention)
        pipeline.lora = lora
        for index, name in enumerate(names):
            lora.acquire(f"r{index}", [LoraChoice(name, 1.0)])
        deadline = time.monotonic() + 600
        while not all(lora.ready(f"r{i}") for i in range(NUM_REQUESTS)):
            if time.monotonic() > deadline:
                raise SystemExit("adapters did not load in 10 minutes")
            time.sleep(0.01)
        load_ms = [1000 * s for s in lora.store.stats.load_s]
        size_mb = os.path.getsize(os.path.join(folder, f"{names[0]}.safetensors")) / 2**20
        print(f"wan2.2: load a rank-{RANK} adapter ({size_mb:.0f} MiB, {len(lora.layers.layers)} layers): "
              f"{min(load_ms):.0f}-{max(load_ms):.0f} ms (read, convert, pack; off the step loop)", flush=True)  # fmt: skip
        shape = pipeline.geometry.latent_shape(width, height, frames)
        text = torch.randn(config.max_text_tokens, config.dit.text_dim, device=device)

        def items(prefix: str) -> list[DenoiseItem]:
            return [DenoiseItem(f"{prefix}{i}", label, torch.randn(shape, device=device), 500.0, 0.5, 0, text, {})
                    for i in range(NUM_REQUESTS) for label in (COND, UNCOND)]  # fmt: skip

        with_lora, without = items("r"), items("none")
        timings = {}
        with torch.inference_mode():
            for label, pack in (("without LoRA", without), ("with 4 adapters", with_lora)):
                timings[label] = _time_ms(lambda pack=pack: pipeline.predict(pack), device, repeats)
        base, ours = timings["without LoRA"], timings["with 4 adapters"]
        print(f"wan2.2 {width}x{height}x{frames}: {NUM_REQUESTS} requests x 2 labels, one step: "
              f"{base:.1f} ms without LoRA, {ours:.1f} ms with {NUM_REQUESTS} different rank-{RANK} "
              f"adapters (+{100 * (ours / base - 1):.1f}%; goal <= 10%)", flush=True)  # fmt: skip
        lora.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny config on the CPU (a smoke test)")
    args = parser.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --tiny)")
    device = "cpu" if args.tiny else "cuda"
    if not args.tiny:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    bench_wan(args.tiny, device)


if __name__ == "__main__":
    main()
