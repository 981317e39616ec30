"""Driving the LTX-2 nodes in-process the way the worker does: a request through text_encoder,
(vae_encoder), dit (stepped until it stops, alone or with companions), audio_decoder, vae_decoder."""

from __future__ import annotations

from typing import Any

import msgspec

from mstar.config import ServerConfig
from mstar.diffusion.vae_nodes import INPUT_REFERENCE, LATENTS
from mstar.graph import BuildContext, RequestState
from mstar.models.ltx2.pipeline import AUDIO_LATENTS


def build_nodes(spec, model_path: str | None = None, names: tuple[str, ...] | None = None, **server_fields):
    server = ServerConfig(
        compile_mode="off", warmup=False, random_weights=model_path is None, **server_fields
    )
    ctx = BuildContext(
        server, "cpu", names or spec.node_names, model_path=model_path, random_weights=model_path is None
    )
    return spec.build_nodes(ctx)


def new_request(spec, request_id: str, image: Any = None, **fields: Any) -> RequestState:
    params = msgspec.convert({**fields, "image_to_video": image is not None}, spec.params_type)
    request = RequestState(request_id, params)
    if image is not None:
        request.tensors[INPUT_REFERENCE] = image
    return request


def denoise(nodes, requests: list[RequestState]) -> None:
    """Text (and the first frame), then every request's steps packed together until each stops."""
    nodes["text_encoder"].forward(requests)
    with_image = [r for r in requests if r.params.image_to_video]
    if with_image:
        nodes["vae_encoder"].forward(with_image)
    dit = nodes["dit"]
    for request in requests:
        dit.prepare(request)
    active = list(requests)
    while active:
        dit.forward(active)
        active = [r for r in active if not dit.check_stop(r)]


def final_latents(request: RequestState):
    return request.tensors[LATENTS], request.tensors.get(AUDIO_LATENTS)


def decode(nodes, request: RequestState):
    """(uint8 frames [F, H, W, 3], waveform float32 [channels, samples] or None)."""
    if request.params.audio:
        nodes["audio_decoder"].forward([request])
    nodes["vae_decoder"].forward([request])
    return request.tensors["frames"], request.tensors.get("audio")
