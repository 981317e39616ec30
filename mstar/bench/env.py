"""What a benchmark figure was measured with: date, GPU, library versions, commit, command."""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import subprocess
import sys
from typing import Any

PACKAGES = ("torch", "triton", "diffusers", "transformers", "fa3-fwd", "flashinfer-python", "mstar")


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        result = subprocess.run(
            # "-dirty" when the files differ from the commit (a copied tree, local edits)
            ["git", "describe", "--always", "--dirty", "--abbrev=7"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _cuda_info() -> dict[str, Any]:
    """GPU name and CUDA version when torch is importable; never initialises CUDA without torch."""
    try:
        import torch
    except ImportError:
        return {"gpu": None, "cuda": None}
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"gpu": gpu, "cuda": torch.version.cuda}


def _smi_info() -> dict[str, Any]:
    """GPU name from nvidia-smi (the serve client need not have torch)."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"gpu": None, "cuda": None}
    names = result.stdout.strip().splitlines()
    return {"gpu": names[0] if names else None, "cuda": None}


def env_info(argv: list[str] | None = None, with_cuda: bool = True) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": _git_commit(),
        "versions": {name: package_version(name) for name in PACKAGES},
        "command": " ".join(["mstar", "bench", *(argv if argv is not None else sys.argv[1:])]),
    }
    info.update(_cuda_info() if with_cuda else _smi_info())
    return info
