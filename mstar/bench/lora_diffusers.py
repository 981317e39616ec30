"""`python -m mstar.bench.lora_diffusers`: diffusers serving four requests that name four different
LoRA adapters, one adapter at a time, fused into the weights; the baseline beside
`mstar.bench.lora_step` (ours: the four requests in one packed step, no fusing).

Per family, at lora_step's sizes (Wan2.2 832x480x33 with its guidance pair, Z-Image-Turbo and
FLUX.2 [klein] 4B at 1024x1024), diffusers' transformer is built from the real config (seeded random
weights, bf16, eager) and given lora_step's four rank-32 adapter files. Printed, one line each:
- a step of one request without an adapter (its labels as one batch, as the pipeline calls it);
- one switch: unfuse and unload the last adapter, `load_lora_adapter` and `fuse_lora` the next;
- a step of one request with its adapter fused (fusing changes the weights, not the step);
- the four requests one adapter at a time: four switches and four steps, wall clock.

Needs diffusers and peft (on a GPU machine without network, `bash bench/h200.sh wheels test` packs
both); `--tiny` runs the tiny configs on the CPU, a smoke test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from mstar.bench.lora_step import FAMILIES, NUM_REQUESTS, RANK, write_adapters
from mstar.engine.timing import device_ms

# one request's step, as lora_step packs four of them (real size, tiny)
WORKLOADS = {
    "wan2.2": ("wan-480p-cfg", "tiny-wan-cfg"),
    "z-image": ("zimage-1024-b1", "tiny-zimage-c2"),
    "flux2-klein": ("flux2-1024-b1", "tiny-flux2-c2"),
}


def write_family_adapters(name: str, tiny: bool, folder: str) -> list[str]:
    """lora_step's four adapter files for `name`, from our DiT's LoRA targets (diffusers' module
    names by contract), written into `folder`; our DiT is dropped again."""
    family = FAMILIES[name](tiny, "cpu" if tiny else "cuda", torch.float32 if tiny else torch.bfloat16)
    names = write_adapters(folder, family.dit, family.targets(family.dit), RANK)
    del family
    return [os.path.join(folder, f"{adapter}.safetensors") for adapter in names]


def _switch(model, path: str, fused: str | None) -> str:
    """Unfuse and drop the adapter `fused` (if any), load and fuse the one at `path`; its name."""
    if fused is not None:
        model.unfuse_lora()
        model.delete_adapters(fused)
    name = os.path.basename(path).removesuffix(".safetensors")
    model.load_lora_adapter(path, adapter_name=name, prefix="transformer")
    model.fuse_lora(lora_scale=1.0, adapter_names=[name])
    return name


def _clock_ms(device: str) -> float:
    """Wall clock (ms) once the device has finished what was queued (fusing runs on the device)."""
    if device == "cuda":
        torch.cuda.synchronize()
    return 1000 * time.perf_counter()


def bench_family(name: str, tiny: bool, repeats: int = 10) -> dict[str, float]:
    """The four figures above for one family, printed and returned (ms)."""
    from mstar.bench.baseline import diffusers_transformer, step_workloads

    device, dtype = ("cpu", torch.float32) if tiny else ("cuda", torch.bfloat16)
    entry, workload = step_workloads()[WORKLOADS[name][tiny]]
    with tempfile.TemporaryDirectory() as folder:
        paths = write_family_adapters(name, tiny, folder)
        model = diffusers_transformer(entry, entry.transformer_config(tiny), device, dtype, seed=0)
        items = entry.example_items(workload, device, dtype, 0)

        def step():
            return entry.diffusers_forward(model, items)

        with torch.inference_mode():
            plain = device_ms(step, device, repeats)
        fused = None
        switches = []
        for path in paths:  # warms the load path, and each switch is timed once
            start = _clock_ms(device)
            fused = _switch(model, path, fused)
            switches.append(_clock_ms(device) - start)
        with torch.inference_mode():
            with_adapter = device_ms(step, device, repeats)
            start = _clock_ms(device)
            for path in paths:  # the four requests, one adapter at a time
                fused = _switch(model, path, fused)
                step()
            four = _clock_ms(device) - start
    switch = sorted(switches[1:])[len(switches[1:]) // 2]
    label = f"{name} {workload.width}x{workload.height}x{workload.num_frames}"
    print(f"{label}, diffusers eager: one request's step {plain:.1f} ms without an adapter, {with_adapter:.1f} ms "
          f"with one fused; switching adapters (unfuse, unload, load, fuse) {switch:.0f} ms; {NUM_REQUESTS} "
          f"requests with {NUM_REQUESTS} different adapters, one at a time: {four:.0f} ms", flush=True)  # fmt: skip
    return {"step_ms": plain, "fused_step_ms": with_adapter, "switch_ms": switch, "four_requests_ms": four}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny configs on the CPU (a smoke test)")
    parser.add_argument("--family", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    args = parser.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device (or --tiny)")
    if not args.tiny:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    for name in args.family:
        bench_family(name, args.tiny)
        if not args.tiny:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
