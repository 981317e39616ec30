"""Hand-written Triton kernels checked on the CPU: Triton's interpreter runs them on CPU tensors.

TRITON_INTERPRET must be set before a kernel is built, so the check runs in a child process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

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
