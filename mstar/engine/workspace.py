"""The one scratch buffer every attention wrapper of a process shares on a device.

Allocated at build, before the model's weights and activations claim memory, so a long sequence
cannot fail later for want of attention scratch space.
"""

from __future__ import annotations

import torch

BYTES_PER_MB = 1024 * 1024

_shared: dict[tuple[str, int], torch.Tensor] = {}


def allocate_workspace(device: str | torch.device, workspace_mb: int) -> torch.Tensor:
    """A fresh uint8 [workspace_mb MiB] tensor on `device`."""
    if workspace_mb < 1:
        raise ValueError(f"workspace_mb must be >= 1, got {workspace_mb}")
    with torch.inference_mode(False):  # a normal tensor, whichever mode the first builder runs in
        return torch.empty(workspace_mb * BYTES_PER_MB, dtype=torch.uint8, device=device)


def shared_workspace(device: str | torch.device, workspace_mb: int) -> torch.Tensor:
    """The process-wide workspace of `device` (reused by every node built on it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device.type, -1 if device.index is None else device.index)
    workspace = _shared.get(key)
    if workspace is None or workspace.numel() < workspace_mb * BYTES_PER_MB:
        workspace = allocate_workspace(device, workspace_mb)
        _shared[key] = workspace
    return workspace


def release_workspaces() -> None:
    """Drop the shared workspaces (tests; a worker keeps its workspace for its lifetime)."""
    _shared.clear()
