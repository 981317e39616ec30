"""Checks the hand-written kernels' tests share.

On the CPU, Triton's interpreter runs a kernel on CPU tensors. TRITON_INTERPRET must be set before
a kernel is built, so that check runs in a child process. On CUDA (gpu tier), inductor must launch
each triton_op's kernel from its compiled graph."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterable

import pytest

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed"
)


def run_under_interpreter(code: str) -> None:
    """Run `code` (which prints "ok" when its checks pass) in a child under Triton's interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"


def assert_op_names_its_kernel(op_name: str, kernel) -> None:
    """A triton_op names its kernels, so a compiled graph's cache key covers their source."""
    import torch

    assert torch._library.triton.get_triton_kernels_for_op(op_name) == [kernel]


def assert_inductor_launches(kernel_name: str, fn: Callable, arg_sets: Iterable[tuple]) -> None:
    """fn compiled once (pack length dynamic) gives the values of fn run eagerly for every arg set,
    and inductor's output code launches `kernel_name` itself: no call back into Python."""
    import torch
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(fn, fullgraph=True, dynamic=True)
    codes: list[str] = []
    for args in arg_sets:
        got, codes = run_and_get_code(compiled, *args)
        want = fn(*args)
        for ours, theirs in zip(
            *((got, want) if isinstance(want, tuple) else ((got,), (want,))), strict=True
        ):
            assert torch.equal(ours, theirs)
    code = "\n".join(codes)
    assert kernel_name in code and "torch.ops.mstar" not in code
