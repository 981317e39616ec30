"""Seeded CPU outputs of every model family, hashed: what the golden test compares.

    python -m tests.golden.outputs            # prints {case: sha256} as JSON
    python -m tests.golden.outputs --write    # rewrites tests/golden/expected_sha256.json

Each group of requests runs through its model's walks together, in-process, the way a worker's step
loop runs them (every request waiting at a node rides in one forward; a denoise loop steps all of
its requests together until each stops), so "packed" cases hold the outputs of a request that
shared its denoise steps with others. The final latents (when the denoise loop ends) and the uint8
frames of every request are hashed.

Numerics are pinned before torch is imported, so one set of hashes holds on any x86-64 CPU: BLAS and
MKL's vector maths in their conditional-reproducibility mode (`MKL_CBWR=COMPATIBLE`: the same code
path, and the same results, on every Intel or AMD processor), ATen's kernels at their baseline
(non-AVX) build, oneDNN off (convolutions go through ATen and MKL), one thread, deterministic
algorithms. Without this, BLAS picks kernels by instruction set and cache size, and float sums in
another order change the last bits.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MSTAR_GOLDEN_PINNED": "1",
}
EXPECTED_PATH = Path(__file__).with_name("expected_sha256.json")
REPO_ROOT = Path(__file__).resolve().parents[2]


def pinned_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "ONEDNN_", "DNNL_"))}
    env.update(PINNED_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _digest(tensor) -> str:
    import numpy as np
    import torch

    array = (
        tensor.detach().cpu().contiguous().numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)
    )
    digest = hashlib.sha256(f"{array.dtype}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def compute() -> dict[str, str]:
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.mkldnn.enabled = False
    from tests.golden.cases import GROUPS, run_group

    hashes: dict[str, str] = {}
    for group in GROUPS:
        for name, tensors in run_group(group).items():
            for key, tensor in sorted(tensors.items()):
                hashes[f"{name}/{key}"] = _digest(tensor)
    return hashes


def main(argv: list[str]) -> int:
    if os.environ.get("MSTAR_GOLDEN_PINNED") != "1":
        os.execve(sys.executable, [sys.executable, "-m", "tests.golden.outputs", *argv], pinned_env())
    hashes = compute()
    text = json.dumps(hashes, indent=2, sort_keys=True) + "\n"
    if "--write" in argv:
        EXPECTED_PATH.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
