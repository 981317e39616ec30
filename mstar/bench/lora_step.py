"""`python -m mstar.bench.lora_step`: a served DiT step with per-request LoRA on this GPU, per family.

For each family (Wan2.2-TI2V-5B at 832x480x33 with guidance, Z-Image-Turbo at 1024x1024,
FLUX.2 [klein] 4B at 1024x1024) builds the DiT (seeded random weights, bf16) as the server does
(optimize -> LoRA layers -> compile), writes four rank-32 adapter files (every Linear the family
takes LoRA on) into a temporary lora_dir, loads them through the adapter store (the per-adapter
load time: read, convert, pack) and times one packed step of four requests through the pipeline's
predict: with four different adapters (one per request) against the same pack without adapters
(goal: <= 10% slower). `--family` picks some; `--tiny` runs the tiny configs on the CPU (a smoke
test). Prints one line per measurement.

`--paths grouped,activation` times LoRA paths in turn on the same DiT, each set on every wrapped
Linear (mstar.engine.lora.paths): "activation" is grouped for every Linear but those whose consumer
applies the expand inside its activation (Wan's FFN in, Z-Image's w1/w3, on the kernels path),
which is how the server runs them; "grouped" puts those back on the grouped path (the delta written,
then added by the consumer). Without `--paths`: each Linear's own path, as the server picks it.

`--profile` also runs both steps under torch.profiler and prints where the LoRA step's extra time
goes: ms a step by kernel kind with and without adapters, the idle time (the step's wall time less
its kernels), and the kernels whose time grew most (by name, launches a step).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem
from mstar.engine.lora.paths import PATHS
from mstar.engine.timing import device_ms

RANK, NUM_REQUESTS = 32, 4
LOAD_TIMEOUT_S = 600
NUM_PROFILED, NUM_TOP_GROWN = 3, 15


@dataclass
class FamilyBench:
    """One family's served DiT and a step's items: `items(prefix)` are NUM_REQUESTS requests'
    (request ids prefix0, prefix1, ...), every label of each."""

    name: str
    workload: str  # what one request is, for the printed line
    dit: Any
    optimize: Callable[..., Any]
    targets: Callable[[Any], list]
    rules: Any
    pipeline: Callable[[Any, Any], Any]  # (dit, attention) -> the family's pipeline
    items: Callable[[str], list[DenoiseItem]]


def _wan(tiny: bool, device: str, dtype: torch.dtype) -> FamilyBench:
    from mstar.models.wan22.config import Wan22Config, tiny_wan22_config
    from mstar.models.wan22.dit import WanDiT
    from mstar.models.wan22.lora import wan_lora_targets
    from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
    from mstar.models.wan22.optimize import optimize
    from mstar.models.wan22.pipeline import WanPipeline

    config = tiny_wan22_config() if tiny else Wan22Config()
    width, height, frames = (32, 48, 5) if tiny else (832, 480, 33)
    torch.manual_seed(0)
    with torch.device(device):
        dit = WanDiT(config.dit)
    shape = WanPipeline(config, device, dtype).geometry.latent_shape(width, height, frames)
    text = torch.randn(config.max_text_tokens, config.dit.text_dim, device=device)

    def items(prefix: str) -> list[DenoiseItem]:
        return [DenoiseItem(f"{prefix}{i}", label, torch.randn(shape, device=device), 500.0, 0.5, 0, text, {})
                for i in range(NUM_REQUESTS) for label in (COND, UNCOND)]  # fmt: skip

    return FamilyBench(
        "wan2.2", f"{width}x{height}x{frames}, 2 labels", dit.to(device, dtype), optimize, wan_lora_targets,
        WAN22_LORA_KEYS, lambda dit, attention: WanPipeline(config, device, dtype, dit=dit, attention=attention),
        items,
    )  # fmt: skip


def _zimage(tiny: bool, device: str, dtype: torch.dtype) -> FamilyBench:
    from mstar.models.zimage.bench import TEXT_TOKENS
    from mstar.models.zimage.config import REAL, TINY
    from mstar.models.zimage.lora import zimage_lora_targets
    from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS
    from mstar.models.zimage.optimize import optimize
    from mstar.models.zimage.pipeline import ZImagePipeline
    from mstar.models.zimage.weights import build_dit

    config = TINY if tiny else REAL
    width, height = (48, 40) if tiny else (1024, 1024)
    latent = ZImagePipeline(config, device).geometry.latent_size(width, height)
    caption = torch.randn(16 if tiny else TEXT_TOKENS, config.dit.cap_feat_dim, device=device)

    def items(prefix: str) -> list[DenoiseItem]:
        latents = [torch.randn(config.dit.in_channels, *latent, device=device) for _ in range(NUM_REQUESTS)]
        return [
            DenoiseItem(f"{prefix}{i}", COND, x, 500.0, 0.5, 0, caption, {}) for i, x in enumerate(latents)
        ]

    return FamilyBench(
        "z-image", f"{width}x{height}", build_dit(config.dit, device, dtype), optimize, zimage_lora_targets,
        ZIMAGE_LORA_KEYS, lambda dit, attention: ZImagePipeline(config, device, dit=dit, attention=attention),
        items,
    )  # fmt: skip


def _flux2(tiny: bool, device: str, dtype: torch.dtype) -> FamilyBench:
    from mstar.models.flux2_klein.config import KLEIN_4B, TINY
    from mstar.models.flux2_klein.lora import flux2_lora_targets
    from mstar.models.flux2_klein.lora_keys import FLUX2_LORA_KEYS
    from mstar.models.flux2_klein.optimize import optimize
    from mstar.models.flux2_klein.pipeline import Flux2KleinPipeline
    from mstar.models.flux2_klein.weights import build_dit

    config = TINY if tiny else KLEIN_4B
    width, height = (48, 64) if tiny else (1024, 1024)
    grid = Flux2KleinPipeline(config, device).geometry.latent_grid(width, height)
    transformer = config.transformer
    text = torch.randn(config.max_sequence_length, transformer.joint_attention_dim, device=device)

    def items(prefix: str) -> list[DenoiseItem]:
        latents = [torch.randn(transformer.in_channels, *grid, device=device) for _ in range(NUM_REQUESTS)]
        return [DenoiseItem(f"{prefix}{i}", COND, x, 500.0, 0.5, 0, text, {}) for i, x in enumerate(latents)]

    return FamilyBench(
        "flux2-klein", f"{width}x{height}", build_dit(transformer, device, dtype), optimize, flux2_lora_targets,
        FLUX2_LORA_KEYS, lambda dit, attention: Flux2KleinPipeline(config, device, dit=dit, attention=attention),
        items,
    )  # fmt: skip


FAMILIES = {"wan2.2": _wan, "z-image": _zimage, "flux2-klein": _flux2}


def write_adapters(folder: str, dit, targets, rank: int) -> list[str]:
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


def _load(lora, folder: str, names: list[str], family: str) -> None:
    """Acquire one adapter per request through the store and wait until all are resident."""
    from mstar.params import LoraChoice

    for index, name in enumerate(names):
        lora.acquire(f"r{index}", [LoraChoice(name, 1.0)])
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while not all(lora.ready(f"r{i}") for i in range(NUM_REQUESTS)):
        if time.monotonic() > deadline:
            raise SystemExit(f"{family}: adapters did not load in {LOAD_TIMEOUT_S} s")
        time.sleep(0.01)
    load_ms = [1000 * s for s in lora.store.stats.load_s]
    size_mb = os.path.getsize(os.path.join(folder, f"{names[0]}.safetensors")) / 2**20
    print(f"{family}: load a rank-{RANK} adapter ({size_mb:.0f} MiB, {len(lora.layers.layers)} layers): "
          f"{min(load_ms):.0f}-{max(load_ms):.0f} ms (read, convert, pack; off the step loop)", flush=True)  # fmt: skip


def print_profile(label: str, with_lora: Callable[[], Any], without: Callable[[], Any], device: str) -> None:
    """Where the LoRA step's extra device time goes, from NUM_PROFILED steps of each under the profiler."""
    from collections import defaultdict

    from mstar.bench.profile import kernel_events, summarize_kernels

    summaries, totals = [], []
    for fn in (without, with_lora):
        events = kernel_events(fn, NUM_PROFILED, device)
        summaries.append(summarize_kernels(events, NUM_PROFILED))
        per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for kernel, duration_us in events:
            per_name[kernel][0] += duration_us / 1000 / NUM_PROFILED
            per_name[kernel][1] += 1 / NUM_PROFILED
        totals.append(per_name)
    kinds = sorted(set(summaries[0]["by_kind_ms"]) | set(summaries[1]["by_kind_ms"]))
    by_kind = ", ".join(
        f"{kind} {summaries[0]['by_kind_ms'].get(kind, 0):.1f} -> {summaries[1]['by_kind_ms'].get(kind, 0):.1f}"
        for kind in kinds
    )
    base_kernels, lora_kernels = (summary["kernel_ms_per_step"] for summary in summaries)
    print(
        f"{label}: kernel ms a step without -> with LoRA: {base_kernels:.1f} -> {lora_kernels:.1f} ({by_kind})"
    )
    wall = [device_ms(fn, device, NUM_PROFILED) for fn in (without, with_lora)]
    print(
        f"{label}: idle ms a step (wall less kernels): {wall[0] - base_kernels:.1f} -> {wall[1] - lora_kernels:.1f}"
    )
    grown = sorted(totals[1], key=lambda kernel: totals[0].get(kernel, (0.0, 0.0))[0] - totals[1][kernel][0])
    for kernel in grown[:NUM_TOP_GROWN]:
        before = totals[0].get(kernel, (0.0, 0.0))
        after = totals[1][kernel]
        print(
            f"  +{after[0] - before[0]:.2f} ms ({before[1]:.0f} -> {after[1]:.0f} launches): {kernel[:140]}"
        )


def bench_family(
    name: str, tiny: bool, device: str, repeats: int = 10, paths: Sequence[str] = (), profile: bool = False
) -> None:
    """`paths`: the LoRA paths to time in turn on the same DiT (each recompiles the stack once,
    in the warmup calls); empty: the rule's choice per Linear, as the server runs it."""
    from mstar.engine.attention import build_attention
    from mstar.engine.compile import effective_mode
    from mstar.engine.lora.serving import attach_lora
    from mstar.models.scaffold import speed_up, speed_ups

    dtype = torch.float32 if tiny else torch.bfloat16
    family = FAMILIES[name](tiny, device, dtype)
    dit = family.dit.eval().requires_grad_(False)
    server = SimpleNamespace(fuse_projections=True, triton_kernels=True, compile_mode="deterministic")
    fuse, kernels = speed_ups(server, device)
    mode = effective_mode("deterministic", device) if not tiny else "off"
    with tempfile.TemporaryDirectory() as folder:
        lora_config = SimpleNamespace(lora_dir=folder, max_loras=NUM_REQUESTS, max_lora_rank=RANK,
                                      max_loras_per_request=1)  # fmt: skip
        holder = {}

        def wrap(model):
            holder["lora"] = attach_lora(model, family.targets, lora_config, family.rules)

        dit, _ = speed_up(dit, family.optimize, fuse, kernels, mode, f"bench.lora.{name}", wrap=wrap)
        lora = holder["lora"]
        names = write_adapters(folder, dit, lora.layers.targets, RANK)
        _load(lora, folder, names, name)
        pipeline = family.pipeline(dit, build_attention("auto", device, dtype))
        pipeline.lora = lora
        with_lora, without = family.items("r"), family.items("none")
        with torch.inference_mode():
            base = device_ms(lambda: pipeline.predict(without), device, repeats)
            for path in paths or [None]:
                for layer in lora.layers.layers if path else ():
                    layer.lora_path = path
                ours = device_ms(lambda: pipeline.predict(with_lora), device, repeats)
                print(f"{name} {family.workload}: {NUM_REQUESTS} requests, one step: {base:.1f} ms without "
                      f"LoRA, {ours:.1f} ms with {NUM_REQUESTS} different rank-{RANK} adapters"
                      f"{f' ({path} path)' if path else ''} (+{100 * (ours / base - 1):.1f}%; goal <= 10%)",
                      flush=True)  # fmt: skip
                if profile:
                    label = f"{name}{f' ({path} path)' if path else ''}"
                    print_profile(
                        label, lambda: pipeline.predict(with_lora), lambda: pipeline.predict(without), device
                    )
        lora.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny configs on the CPU (a smoke test)")
    parser.add_argument("--family", nargs="+", choices=sorted(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--paths", type=lambda text: text.split(","), default=[],
                        help="LoRA paths to time in turn, e.g. grouped,activation (default: each Linear's own)")  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="where the extra time goes (torch.profiler)")
    args = parser.parse_args()
    if unknown := set(args.paths) - set(PATHS):
        parser.error(f"--paths: unknown {sorted(unknown)}; choose from {PATHS}")
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --tiny)")
    device = "cpu" if args.tiny else "cuda"
    if not args.tiny:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for name in args.family:
        bench_family(name, args.tiny, device, paths=args.paths, profile=args.profile)
        torch._dynamo.reset()  # the next family's graphs; this one's DiT can go
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
