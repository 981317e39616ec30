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


def _git(
    *args: str, directory: str | None = None, env: dict[str, str] | None = None, timeout_s: float = 60
) -> str | None:
    """git's stripped output ("" when it says nothing), or None when git is missing or fails."""
    try:
        result = subprocess.run(
            ["git", *args], cwd=directory, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _git_commit() -> str | None:
    # "-dirty" when the files differ from the commit (a copied tree, local edits)
    return _git("describe", "--always", "--dirty", "--abbrev=7", timeout_s=5) or None


def working_tree_hash(directory: str | None = None) -> str | None:
    """Git's tree hash of the files as they are (tracked and not ignored, edits included), taken
    through a scratch index so the repository's own index is untouched.

    Why: a copied tree's git metadata can be older than its files (the H200's copy described
    itself as a commit of hours before), but the same files give the same tree hash anywhere, and
    `commit_of_tree` finds the commit that holds them."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        environment = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        if _git("add", "-A", directory=directory, env=environment) is None:
            return None
        return _git("write-tree", directory=directory, env=environment) or None


def commit_of_tree(tree: str, directory: str | None = None) -> str | None:
    """The newest commit (short hash) whose files are exactly `tree`, or None."""
    for line in (
        _git("log", "--all", "--format=%h %T", directory=directory, timeout_s=30) or ""
    ).splitlines():
        commit, _, commit_tree = line.partition(" ")
        if commit_tree == tree:
            return commit
    return None


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
        "tree": working_tree_hash(),
        "versions": {name: package_version(name) for name in PACKAGES},
        "command": " ".join(["mstar", "bench", *(argv if argv is not None else sys.argv[1:])]),
    }
    info.update(_cuda_info() if with_cuda else _smi_info())
    return info
