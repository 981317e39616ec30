"""What the device is and which attention libraries this process can import (lazily, once asked)."""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

# backend name -> (distribution on PyPI, module to import)
LIBRARIES = {
    "fa3": ("fa3-fwd", "fa3_fwd_interface"),
    "flashinfer": ("flashinfer-python", "flashinfer"),
}
NOT_INSTALLED = "not installed"


@dataclass(frozen=True)
class Platform:
    device: torch.device
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None

    @property
    def is_cuda(self) -> bool:
        return self.gpu_name is not None

    @property
    def is_hopper(self) -> bool:
        return self.capability is not None and self.capability[0] == 9

    def describe(self) -> str:
        if not self.is_cuda or self.capability is None:
            return "cpu"
        major, minor = self.capability
        return f"{self.gpu_name} (sm_{major}{minor})"


def detect_platform(device: torch.device) -> Platform:
    if device.type == "cpu":
        return Platform(device)
    if device.type != "cuda":
        raise ValueError(f"attention: unsupported device '{device}' (cpu or cuda:N)")
    if not torch.cuda.is_available():
        raise ValueError(
            f"attention: device '{device}' requested but CUDA is not available (torch {torch.__version__})"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    return Platform(
        torch.device("cuda", index),
        torch.cuda.get_device_name(index),
        tuple(torch.cuda.get_device_capability(index)),  # type: ignore[arg-type]
    )


class Libraries:
    """Imports attention libraries on first use; tests pass module-like fakes instead.

    `injected` maps a backend name ("fa3", "flashinfer") to a module (with `__version__`) or to
    None for "not installed"; names not in it are imported for real.
    """

    def __init__(self, injected: Mapping[str, Any] | None = None) -> None:
        self._injected = dict(injected or {})
        self._loaded: dict[str, tuple[Any, str | None]] = {}

    def module(self, name: str) -> Any | None:
        """The imported module, or None when it is absent or fails to import."""
        return self._load(name)[0]

    def import_error(self, name: str) -> str | None:
        return self._load(name)[1]

    def version(self, name: str) -> str:
        """Version without importing (metadata), so error messages cost nothing."""
        if name in self._injected:
            module = self._injected[name]
            return NOT_INSTALLED if module is None else str(getattr(module, "__version__", "unknown"))
        distribution, _ = LIBRARIES[name]
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return NOT_INSTALLED

    def describe(self, name: str) -> str:
        """e.g. 'fa3-fwd 0.0.3' or 'flashinfer-python not installed'."""
        if name == "torch":
            return f"torch {torch.__version__}"
        return f"{LIBRARIES[name][0]} {self.version(name)}"

    def _load(self, name: str) -> tuple[Any, str | None]:
        if name in self._loaded:
            return self._loaded[name]
        if name in self._injected:
            module = self._injected[name]
            result = (module, None if module is not None else NOT_INSTALLED)
        else:
            result = _import(LIBRARIES[name][1])
        self._loaded[name] = result
        return result


def _import(module_name: str) -> tuple[Any, str | None]:
    try:
        return importlib.import_module(module_name), None
    except Exception as error:  # a wheel built for another CUDA raises OSError/RuntimeError too
        return None, f"{type(error).__name__}: {error}"
