"""`python -m mstar.engine.lora.bench`: what per-request LoRA costs a packed DiT step's Linears on this
GPU, per path (mstar.engine.lora.paths), and how long an adapter takes to load.

For each family's block Linears at full size (bf16, the rows of a pack of four requests, two guidance
labels each for Wan) times one Linear compiled as the DiT stacks are: without LoRA, and with four
different rank-32 adapters (one per request) through each path; prints ms per call and the overhead
per shape, then per family the Linears' sum over a step (count x ms) per path: the ms a step adds
and the overhead over the Linears alone (attention is not in it). The cost model's bytes per row
and the path the rule picks are printed next to each shape. Then the time to load a rank-32
adapter of each family's size (read, convert, pack into pinned memory, copy to a slot). CUDA
events; one line per measurement.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time

import torch
from torch import nn

from mstar.adapters import LoraKeyRules
from mstar.engine.compile import CompiledFunction
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.paths import LINEAR_PATHS, choose_path, path_bytes_per_row
from mstar.engine.lora.weights import load_adapter
from mstar.engine.lora.wrap import LoraLayers, LoraSlice, LoraTarget, linear_targets
from mstar.engine.timing import device_ms

RANK, NUM_ADAPTERS = 32, 4
WAN_ROWS = 3120  # tokens of one 832x480x33 label, as the served step packs them
ZIMAGE_ROWS = 4096 + 128  # 64x64 patches of a 1024x1024 image, a 128-token caption
FLUX2_IMAGE_ROWS, FLUX2_TEXT_ROWS = 4096, 512
# family: (bias, labels per request, [(name, in, out, slices, Linears per step, rows per label)])
FAMILIES = {
    "wan2.2 832x480x33": (True, 2, [
        ("q/k/v", 3072, 9216, 3, 30, WAN_ROWS),
        ("attention out, cross q", 3072, 3072, 1, 90, WAN_ROWS),
        ("ffn in", 3072, 14336, 1, 30, WAN_ROWS),
        ("ffn out", 14336, 3072, 1, 30, WAN_ROWS),
    ]),
    "z-image 1024": (False, 1, [
        ("q/k/v", 3840, 11520, 3, 30, ZIMAGE_ROWS),
        ("attention out", 3840, 3840, 1, 30, ZIMAGE_ROWS),
        ("w1/w3", 3840, 20480, 2, 30, ZIMAGE_ROWS),
        ("w2", 10240, 3840, 1, 30, ZIMAGE_ROWS),
    ]),
    "flux2-klein 1024": (False, 1, [
        ("double q/k/v", 3072, 9216, 3, 5, FLUX2_IMAGE_ROWS),
        ("double out", 3072, 3072, 1, 5, FLUX2_IMAGE_ROWS),
        ("double ff in", 3072, 18432, 1, 5, FLUX2_IMAGE_ROWS),
        ("double ff out", 9216, 3072, 1, 5, FLUX2_IMAGE_ROWS),
        ("single qkv+mlp", 3072, 27648, 1, 20, FLUX2_IMAGE_ROWS + FLUX2_TEXT_ROWS),
        ("single out", 12288, 3072, 1, 20, FLUX2_IMAGE_ROWS + FLUX2_TEXT_ROWS),
    ]),
}  # fmt: skip


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _wrapped_linear(in_features, out_features, num_slices, bias, path, device):
    parent = nn.Module()
    parent.linear = nn.Linear(in_features, out_features, bias=bias).to(device, torch.bfloat16)
    width = out_features // num_slices
    slices = tuple(LoraSlice(f"s{j}", width) for j in range(num_slices))
    layers = LoraLayers(parent, [LoraTarget("linear", slices)], NUM_ADAPTERS, RANK, path=path)
    with torch.no_grad():
        for layer in layers.layers:
            layer.lora_a.normal_(0, 0.02)
            for b in layer.lora_b():
                b.normal_(0, 0.02)
    return parent.linear, layers


def bench_shape(family, shape, bias, labels, device="cuda") -> dict[str, float]:
    """ms per call of one Linear of `shape`: "base" (no LoRA) and each path with four adapters."""
    name, in_features, out_features, num_slices, _, rows = shape
    lengths = [rows] * (labels * NUM_ADAPTERS)
    choices = [[(1 + index // labels, 1.0)] for index in range(len(lengths))]
    x = torch.randn(sum(lengths), in_features, device=device, dtype=torch.bfloat16)
    mode = "deterministic" if device.startswith("cuda") else "off"
    timings: dict[str, float] = {}
    for path in LINEAR_PATHS:
        linear, layers = _wrapped_linear(in_features, out_features, num_slices, bias, path, device)
        compiled = CompiledFunction(linear, mode, f"lora-bench {family} {name} {path}", duck_shapes=False)
        with torch.inference_mode():
            if "base" not in timings:
                timings["base"] = device_ms(functools.partial(compiled, x), device)
            layers.context.set("tokens", LoraRows.build(lengths, choices, device, torch.bfloat16))
            timings[path] = device_ms(functools.partial(compiled, x), device)
    cost = path_bytes_per_row(in_features, out_features, num_slices, NUM_ADAPTERS, RANK, len(x))
    picked = choose_path(in_features, out_features, num_slices, NUM_ADAPTERS, RANK, many_rows=True)
    parts = [f"{p} {timings[p]:.3f} ms (+{100 * (timings[p] / timings['base'] - 1):.1f}%, model {cost[p] / 1000:.1f} kB/row)"
             for p in LINEAR_PATHS]  # fmt: skip
    print(f"{family} {name} {in_features}->{out_features} x{num_slices}, {len(x)} rows: "
          f"base {timings['base']:.3f} ms; " + "; ".join(parts) + f"; rule picks {picked}", flush=True)  # fmt: skip
    return timings


def bench_step(family, device="cuda") -> None:
    """Every shape of the family, then the step's Linears summed per path."""
    bias, labels, shapes = FAMILIES[family]
    totals = dict.fromkeys(("base", *LINEAR_PATHS), 0.0)
    for shape in shapes:
        timings = bench_shape(family, shape, bias, labels, device)
        for key, ms in timings.items():
            totals[key] += shape[4] * ms
    base = totals["base"]
    parts = [f"{p} +{totals[p] - base:.1f} ms (+{100 * (totals[p] / base - 1):.1f}%)" for p in LINEAR_PATHS]
    print(f"{family}: a step's block Linears, {NUM_ADAPTERS} requests with {NUM_ADAPTERS} rank-{RANK} adapters: "
          f"{base:.1f} ms without LoRA; " + "; ".join(parts), flush=True)  # fmt: skip


def _stack(shapes, num_layers):
    return nn.Sequential(*[nn.Linear(i, o, bias=False) for _ in range(num_layers) for i, o in shapes])


def bench_load(name, num_layers, shapes, device="cuda") -> None:
    model = _stack(shapes, num_layers).to(device, torch.bfloat16)
    names = [n for n, _ in model.named_children()]
    layers = LoraLayers(model, linear_targets(model), num_slots=1, max_rank=RANK)
    from safetensors.torch import save_file

    tensors = {}
    for module_name, module in model.named_children():
        tensors[f"transformer.{module_name}.lora_A.weight"] = torch.randn(
            RANK, module.in_features, dtype=torch.bfloat16
        )
        tensors[f"transformer.{module_name}.lora_B.weight"] = torch.randn(
            module.out_features, RANK, dtype=torch.bfloat16
        )
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "adapter.safetensors")
        save_file(tensors, path)
        started = time.perf_counter()
        weights = load_adapter(path, LoraKeyRules(family="bench"), names)
        read_s = time.perf_counter() - started
        packed = layers.pack(weights, pin=device.startswith("cuda"))
        packed_s = time.perf_counter() - started
        layers.write(1, packed)
        _sync(device)
        total_s = time.perf_counter() - started
        size_mb = os.path.getsize(path) / 2**20
    print(f"{name}: load a rank-{RANK} adapter ({size_mb:.0f} MiB): read+convert {read_s * 1000:.0f} ms, "
          f"pack {1000 * (packed_s - read_s):.0f} ms, copy to slot {1000 * (total_s - packed_s):.1f} ms", flush=True)  # fmt: skip


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for family, (_, _, shapes) in FAMILIES.items():
        bench_step(family)
        torch._dynamo.reset()
        bench_load(family, 1, [(i, o) for _, i, o, _, count, _ in shapes for _ in range(count)])
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
