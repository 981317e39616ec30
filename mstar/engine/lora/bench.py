"""`python -m mstar.engine.lora.bench`: what per-request LoRA costs a packed DiT step on this GPU.

For each family's block Linears at full size (bf16), times one step's Linears of a pack of four
requests (two guidance labels each for Wan) without LoRA, and with four different rank-32 adapters
(one per request) through the segmented LoRA linear, compiled as the DiT stacks are; prints ms per
step for both and the overhead. Then the time to load a rank-32 adapter of each family's size
(read, convert, pack into pinned memory, copy to a slot). CUDA events; one line per measurement.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
from torch import nn

from mstar.adapters import LoraKeyRules
from mstar.engine.compile import CompiledFunction
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.weights import load_adapter
from mstar.engine.lora.wrap import LoraLayers, linear_targets

RANK, NUM_ADAPTERS = 32, 4
# (name, layers, [(in, out) of each block Linear], tokens per request, labels per request)
FAMILIES = (
    # Wan2.2-TI2V-5B at 832x480x33: 9 x 26 x 52 / 4 = 3120 tokens... (latent 9 frames, 30x52 / 2x2)
    (
        "wan2.2 832x480x33",
        30,
        [(3072, 9216), (3072, 3072), (3072, 3072), (3072, 3072), (3072, 14336), (14336, 3072)],
        3120,
        2,
    ),
    # Z-Image-Turbo at 1024x1024: 64x64 patches = 4096 tokens, no guidance
    ("z-image 1024", 30, [(3840, 11520), (3840, 3840), (3840, 20480), (10240, 3840), (256, 15360)], 4096, 1),
)


def _stack(shapes, num_layers):
    return nn.Sequential(*[nn.Linear(i, o, bias=False) for _ in range(num_layers) for i, o in shapes])


def _time_ms(fn, repeats=10) -> float:
    for _ in range(3):
        fn()
    if not torch.cuda.is_available():  # the CPU smoke test
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


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_step(name, num_layers, shapes, tokens, labels, device="cuda") -> None:
    model = _stack(shapes, num_layers).to(device, torch.bfloat16)
    layers = LoraLayers(model, linear_targets(model), num_slots=NUM_ADAPTERS, max_rank=RANK)
    inputs = {
        i: torch.randn(tokens * labels * NUM_ADAPTERS, i, device=device, dtype=torch.bfloat16)
        for i, _ in shapes
    }
    with torch.no_grad():
        for layer in layers.layers:
            layer.lora_a.normal_(0, 0.02)
            for b in layer.lora_b():
                b.normal_(0, 0.02)
    lengths = [tokens] * (labels * NUM_ADAPTERS)
    choices = [[(1 + index // labels, 1.0)] for index in range(len(lengths))]
    rows = LoraRows.build(lengths, choices, device, torch.bfloat16)

    def run():
        for layer in model:
            layer(inputs[layer.in_features])

    mode = "deterministic" if device.startswith("cuda") else "off"
    compiled = CompiledFunction(run, mode, f"lora-bench {name}", duck_shapes=False)
    with torch.inference_mode():
        layers.context.clear()
        base_ms = _time_ms(compiled)
        layers.context.set("tokens", rows)
        lora_ms = _time_ms(compiled)
    print(f"{name}: {len(lengths)} segments, {NUM_ADAPTERS} rank-{RANK} adapters: linears {base_ms:.2f} ms "
          f"without LoRA, {lora_ms:.2f} ms with (+{100 * (lora_ms / base_ms - 1):.1f}%)", flush=True)  # fmt: skip


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
    for name, num_layers, shapes, tokens, labels in FAMILIES:
        bench_step(name, num_layers, shapes, tokens, labels)
        bench_load(name, num_layers, shapes)


if __name__ == "__main__":
    main()
