"""Hand-written kernels where the compiler's are slow; each has a PyTorch reference and a CPU impl."""

from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("mstar.engine.kernels")


def triton_kernels_usable(device: str) -> bool:
    """Whether `triton_kernels` can take effect on `device`: CUDA with Triton importable. Without
    Triton the models keep their PyTorch code (what the kernels compute), so the option degrades to
    that path with one warning instead of failing the boot."""
    if not str(device).startswith("cuda"):
        return False
    if importlib.util.find_spec("triton") is None:
        logger.warning("triton_kernels: Triton is not installed; the DiTs keep their PyTorch code")
        return False
    return True


def next_power_of_2(n: int) -> int:
    """The block width a row of n elements takes in a Triton program (tl.arange needs a power of 2)."""
    return 1 << (n - 1).bit_length()
