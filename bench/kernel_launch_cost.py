"""Host time per call of our triton_ops' kernels under torch.compile, against inductor's own kernels.

    python3 bench/kernel_launch_cost.py

At 64 tokens the GPU work is a few microseconds, so a chain of calls is bound by the host: the
wall time per call is the host's launch cost. Three ways: the PyTorch definition (inductor's own
kernels), the op with user-defined kernels launched statically (mstar's compile options) and with
Triton's Python launcher.
"""

import json
import time

import torch

import mstar.engine.kernels.qk_norm_rotary  # noqa: F401  registers mstar::qk_norm_rotary
from mstar.engine.kernels.qk_norm_rotary import qk_norm_rotary_reference

NUM_CALLS, NUM_TOKENS, NUM_HEADS, HEAD_DIM = 50, 64, 30, 128


def chain(step):
    def run(x, weight, cos, sin):
        for _ in range(NUM_CALLS):
            x = step(x, weight, cos, sin)
        return x

    return run


def host_us_per_call(run, args) -> float:
    for _ in range(3):
        run(*args)
    torch.cuda.synchronize()
    num_iterations = 40
    start = time.perf_counter()
    for _ in range(num_iterations):
        run(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / (num_iterations * NUM_CALLS) * 1e6


def main() -> None:
    x = torch.randn(NUM_TOKENS, NUM_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(HEAD_DIM, device="cuda", dtype=torch.bfloat16) + 0.5
    angles = torch.randn(NUM_TOKENS, HEAD_DIM // 2, device="cuda")
    args = (x, weight, angles.cos(), angles.sin())
    results = {}
    reference = chain(lambda x, w, c, s: qk_norm_rotary_reference(x, w, c, s, 1e-6, "head"))
    op = chain(lambda x, w, c, s: torch.ops.mstar.qk_norm_rotary(x, w, c, s, 1e-6, "head"))
    for name, fn, static in (("inductor's kernels", reference, True), ("op, static launch", op, True),
                             ("op, Triton's launcher", op, False), ("op, eager", op, None)):  # fmt: skip
        torch._dynamo.reset()
        if static is None:
            results[name] = host_us_per_call(fn, args)
            continue
        options = {"static_launch_user_defined_triton_kernels": static}
        compiled = torch.compile(fn, dynamic=True, options=options)
        results[name] = host_us_per_call(compiled, args)
    print(json.dumps({name: round(us, 1) for name, us in results.items()}, indent=1))


if __name__ == "__main__":
    main()
