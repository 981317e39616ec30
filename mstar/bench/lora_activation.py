"""`python -m mstar.bench.lora_activation`: the LoRA activation kernel alone on this GPU, per tile.

At Wan's FFN in (3072 -> 14336, GELU, a step of four requests x two labels) and Z-Image's w13
(3840 -> 2 x 10240, SwiGLU, four 1024x1024 requests), with four rank-32 adapters, one per
request, times what follows the base GEMM in a step with adapters:
- "act(y)": the activation alone, compiled (the step without LoRA pays it too);
- "act(y + delta)": the grouped path's consumer, compiled (the delta read; its write by the
  expand is not in it);
- "kernel": mstar::lora_activation (the expand inside the activation) at each tile config of
  CANDIDATE_TILES (BLOCK_M, BLOCK_N, num_warps), and the config its module uses (TILES).
Each with its effective bandwidth (bytes of y, delta and out moved, over the time). CUDA events;
one line per shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.engine.lora.bench import WAN_ROWS, ZIMAGE_ROWS
from mstar.engine.timing import device_ms

RANK, NUM_REQUESTS = 32, 4
CANDIDATE_TILES = [(64, 128, 4), (128, 128, 8), (128, 64, 8), (64, 64, 4), (128, 256, 8)]
# name: (activation, slices, out features per slice, rows per request)
SHAPES = {
    "wan2.2 ffn in": ("gelu_tanh", 1, 14336, 2 * WAN_ROWS),
    "z-image w13": ("swiglu", 2, 10240, ZIMAGE_ROWS),
}


def _activated(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


def bench_shape(name: str) -> None:
    from mstar.engine.kernels.lora_activation import TILES, run_triton

    activation, num_slices, width, rows_per_request = SHAPES[name]
    num_rows = NUM_REQUESTS * rows_per_request
    cuda = {"device": "cuda", "dtype": torch.bfloat16}
    y = torch.randn(num_rows, num_slices * width, **cuda)
    delta = torch.randn_like(y) / 10
    hidden = torch.randn(num_rows, num_slices * RANK, **cuda)
    b_seg = torch.randn(NUM_REQUESTS, num_slices, RANK, width, **cuda) / 30
    ends = torch.arange(1, NUM_REQUESTS + 1, device="cuda", dtype=torch.int32) * rows_per_request
    plain = torch.compile(lambda y: _activated(y, activation), dynamic=True)
    grouped = torch.compile(lambda y, delta: _activated(y + delta, activation), dynamic=True)
    out_bytes = 2 * num_rows * width
    timings = {"act(y)": (1000 * device_ms(lambda: plain(y), "cuda", 50), 2 * y.numel() + out_bytes)}
    timings["act(y + delta)"] = (
        1000 * device_ms(lambda: grouped(y, delta), "cuda", 50),
        4 * y.numel() + out_bytes,
    )
    for tiles in dict.fromkeys([TILES[activation], *CANDIDATE_TILES]):
        label = f"kernel {tiles}{' (TILES)' if tiles == TILES[activation] else ''}"
        try:
            us = 1000 * device_ms(
                lambda tiles=tiles: run_triton(y, hidden, b_seg, ends, activation, tiles), "cuda", 50
            )
        except Exception as error:  # a config past the device's registers or shared memory
            print(f"{name}: {label} does not run: {type(error).__name__}", flush=True)
            continue
        timings[label] = (us, 2 * y.numel() + out_bytes)
    parts = [f"{key} {us:.0f} us ({moved / us / 1e6:.2f} TB/s)" for key, (us, moved) in timings.items()]
    print(f"{name}, {num_rows} rows, {NUM_REQUESTS} rank-{RANK} adapters: " + "; ".join(parts), flush=True)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    with torch.inference_mode():
        for name in SHAPES:
            bench_shape(name)


if __name__ == "__main__":
    main()
