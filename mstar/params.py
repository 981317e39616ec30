"""Validated request params: frozen msgspec Structs, one per family, shared by every layer.

`ModelSpec.validate` turns a request's raw fields (graph.GenerationParams) into its family's
Struct, defaults filled in and limits checked. The Struct travels to the workers inside `RunWalk`
(msgpack) and decodes there into the spec's `params_type`, so a node reads
`request.params.width`, never a string key. A family extends one of the bases below with what
only it has (Wan's `image_to_video`); an LLM family starts from RequestParams.
"""

from __future__ import annotations

import msgspec


class LoraChoice(msgspec.Struct, frozen=True):
    """One adapter a request names (mstar.adapters: from the server's lora_dir), with the scale its
    update is multiplied by."""

    name: str
    scale: float = 1.0


class RequestParams(msgspec.Struct, frozen=True, kw_only=True):
    """What every family's params are: a frozen Struct (subclasses say kw_only=True, which
    msgspec does not inherit, so their required fields may follow the bases' defaults)."""


class ImageParams(RequestParams, kw_only=True):
    """A text-to-image request: one frame of width x height pixels."""

    prompt: str
    negative_prompt: str = ""
    width: int
    height: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    num_frames: int = 1
    lora: tuple[LoraChoice, ...] = ()  # checked against the server's adapters (api.service)


class VideoParams(ImageParams, kw_only=True):
    """A video request: num_frames frames at fps."""

    num_frames: int
    fps: int


def encode_params(params: RequestParams) -> msgspec.Raw:
    """The params as msgpack bytes, ready to ride inside a message."""
    return msgspec.Raw(msgspec.msgpack.encode(params))


def decode_params(raw: msgspec.Raw | bytes, params_type: type[RequestParams]) -> RequestParams:
    """The params of `encode_params`, as the spec's Struct (msgspec.ValidationError when they differ)."""
    return msgspec.msgpack.decode(raw, type=params_type)
