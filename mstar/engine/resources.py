"""What a model node asks the engine for at boot: the shared workspace and the attention resource."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mstar.engine.attention import RaggedAttention, build_attention
from mstar.engine.workspace import shared_workspace

if TYPE_CHECKING:
    from mstar.config import ServerConfig


@dataclass
class EngineResources:
    device: torch.device
    dtype: torch.dtype
    workspace: torch.Tensor  # uint8 [workspace_mb MiB], shared by every wrapper on the device
    attention: RaggedAttention


def build_engine_resources(
    config: ServerConfig, device: str | torch.device, dtype: torch.dtype
) -> EngineResources:
    """Workspace first (before any memory planning), then the attention backend from the config.

    Raises ValueError (backend, GPU, library version named) when the configured backend cannot
    run here; the worker reports it and boot fails with that text.
    """
    device = torch.device(device)
    workspace = shared_workspace(device, config.workspace_mb)
    attention = build_attention(
        backend=config.attention_backend,
        device=device,
        dtype=dtype,
        flashinfer_backend=config.flashinfer_backend,
        workspace_mb=config.workspace_mb,
        workspace=workspace,
    )
    return EngineResources(device=device, dtype=dtype, workspace=workspace, attention=attention)
