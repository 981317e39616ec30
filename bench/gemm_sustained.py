"""The Wan guidance pair's GEMMs (7,020 tokens) alone, each shape timed in a short burst, against the
same GEMMs run as a DiT step runs them: a layer's six in order, 30 layers, step after step for a few
seconds. A gap between the two is the GPU's sustained speed (clocks under power draw), which no
kernel choice changes. Run `nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv -lms 200`
beside it to see the clocks.

    python3 bench/gemm_sustained.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mstar.bench.step import time_forward

NUM_TOKENS = 7020  # 832x480x33: 3,510 tokens a request, twice for guidance
DIM, FFN_DIM, NUM_LAYERS = 3072, 14336, 30
# (name, in_features, out_features) in a Wan block's order
LAYER_GEMMS = (
    ("qkv", DIM, 3 * DIM),
    ("self out", DIM, DIM),
    ("cross q", DIM, DIM),
    ("cross out", DIM, DIM),
    ("ffn up", DIM, FFN_DIM),
    ("ffn down", FFN_DIM, DIM),
)


def main() -> None:
    torch.manual_seed(0)
    device, dtype = "cuda", torch.bfloat16
    weights = {name: torch.randn(n, k, device=device, dtype=dtype) / k**0.5 for name, k, n in LAYER_GEMMS}
    biases = {name: torch.randn(n, device=device, dtype=dtype) for name, _, n in LAYER_GEMMS}
    inputs = {k: torch.randn(NUM_TOKENS, k, device=device, dtype=dtype) for _, k, _ in LAYER_GEMMS}

    def gemm(name: str, k: int) -> torch.Tensor:
        return F.linear(inputs[k], weights[name], biases[name])

    def burst_ms(name: str, k: int) -> float:  # each call timed alone with CUDA events: the median of 20
        return time_forward(lambda: gemm(name, k), num_warmup=3, num_timed=20, device=device)["median_ms"]

    burst = {name: burst_ms(name, k) for name, k, _ in LAYER_GEMMS}
    step_burst_ms = NUM_LAYERS * sum(burst.values())

    def step() -> None:
        for _ in range(NUM_LAYERS):
            for name, k, _ in LAYER_GEMMS:
                gemm(name, k)

    num_steps = 40  # about 3.5 s of GEMMs back to back, as 40 DiT steps run them
    step()
    torch.cuda.synchronize()
    step_times = []
    for _ in range(num_steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        step_times.append((start, end))
    torch.cuda.synchronize()
    sustained = [start.elapsed_time(end) for start, end in step_times]
    flops = NUM_LAYERS * sum(2 * NUM_TOKENS * k * n for _, k, n in LAYER_GEMMS)
    for name, k, n in LAYER_GEMMS:
        tflops = 2 * NUM_TOKENS * k * n / burst[name] / 1e9
        print(f"{name} {NUM_TOKENS}x{k}x{n}: {burst[name]:.3f} ms in a burst ({tflops:.0f} TFLOP/s)")
    print(
        f"a step's GEMMs from the burst figures: {step_burst_ms:.2f} ms ({flops / step_burst_ms / 1e9:.0f} TFLOP/s)"
    )
    for label, values in (("first 5", sustained[:5]), ("last 10", sustained[-10:])):
        mean_ms = sum(values) / len(values)
        print(
            f"run back to back, {label} steps: {mean_ms:.2f} ms a step ({flops / mean_ms / 1e9:.0f} TFLOP/s)"
        )


if __name__ == "__main__":
    main()
