"""Denoise nodes of the real models built alone (random weights) and driven like the worker does."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, ModelSpec, Node, RequestState
from mstar.params import RequestParams


def build_dit(spec: ModelSpec, device: str = "cpu", **config: Any) -> Node:
    """Only the "dit" node, random weights, no compile (the eager kernels the step runs on CPU)."""
    config = {"compile_mode": "off", "warmup": False, "random_weights": True, **config}
    server = ServerConfig(**config)
    ctx = BuildContext(config=server, device=device, node_names=("dit",), random_weights=True)
    return spec.build_nodes(ctx)["dit"]


def make_request(request_id: str, params: RequestParams, text_dim: int, text_seed: int, device: str = "cpu"):
    """A request at the dit node: params plus seeded prompt / negative prompt embeddings."""
    generator = torch.Generator().manual_seed(text_seed)
    request = RequestState(request_id, params)
    request.tensors["prompt_embeds"] = torch.randn(7, text_dim, generator=generator).to(device)  # [n, D]
    request.tensors["negative_prompt_embeds"] = torch.randn(5, text_dim, generator=generator).to(device)
    return request


def run_loop(node: Node, requests: list[RequestState]) -> list[torch.Tensor]:
    """Every request steps together until each stops (a finished one leaves the batch)."""
    for request in requests:
        node.prepare(request)
    active = list(requests)
    while active:
        node.forward(active)
        active = [r for r in active if not node.check_stop(r)]
    return [r.tensors["latents"].float().cpu() for r in requests]


def psnr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR over the reference's value range (latents are not in [0, 1]); inf when identical."""
    mse = float(torch.mean((ours.double() - reference.double()) ** 2))
    if mse == 0.0:
        return float("inf")
    peak = float(reference.max() - reference.min())
    return 10 * float(np.log10(peak**2 / mse))


def alone_and_batched(
    spec: ModelSpec, node: Node, params: dict, companions: list[dict], text_dim: int, device: str = "cpu"
):
    """(latents alone, latents of the same request stepped with companions of other sizes); the
    params are the spec's fields (as its validate would resolve them)."""
    params = msgspec.convert(params, spec.params_type)
    companions = [msgspec.convert(fields, spec.params_type) for fields in companions]
    (alone,) = run_loop(node, [make_request("alone", params, text_dim, 1, device)])
    others = [make_request(f"other{i}", p, text_dim, 10 + i, device) for i, p in enumerate(companions)]
    middle = len(others) // 2  # not first in the packed step: its tokens start at an offset
    batch = others[:middle] + [make_request("batched", params, text_dim, 1, device)] + others[middle:]
    batched = run_loop(node, batch)[middle]
    return alone, batched
