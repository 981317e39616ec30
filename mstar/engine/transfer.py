"""Small per-step host -> device copies that do not stall the host.

A plain `.to("cuda")` of a pageable host tensor waits for every kernel queued on the stream, so a
step that builds a few index or timestep tensors on the host would wait for the previous step to
finish before queueing anything. Through (cached) pinned memory the copy is queued like a kernel;
torch's pinned-memory cache keeps the block until the copy has run.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`tensor` on `device`; host -> CUDA copies are queued (non-blocking), never synced."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
