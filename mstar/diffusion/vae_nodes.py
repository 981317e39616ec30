"""The nodes around a denoise loop, shared by every diffusion family, each driving its pipeline:

- `ImageEncodeNode`: an input image into the request's latents (`pipeline.encode_image(request)`:
  Wan's image-to-video first frame, FLUX.2's reference images). Where the pipeline warms its
  encoder (`pipeline.warmup_encode(size, index)`), boot warmup encodes each configured size once,
  then marks `pipeline.encoder` warm;
- `DecodeNode`: the loop's final latents into uint8 frames (`pipeline.decode(latents)`), or, where
  the runtime takes pieces (request.emit_output) and the pipeline makes them, the frames as they
  decode (`pipeline.decode_pieces(latents)`: the MP4 muxer works while the rest of the clip decodes).
  Boot warmup decodes each configured size once (`pipeline.warmup_decode(size, index)`: compiled
  paths compile and are checked against eager), then marks `pipeline.decoder` warm.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mstar.graph import Node, RequestState

LATENTS = "latents"  # what a denoise loop leaves (the pipeline's finish)
FRAMES = "frames"  # uint8 [F, H, W, 3]: what the final walk leaves
INPUT_REFERENCE = "input_reference"  # uint8 [H, W, 3] image from the API


class ImageEncodeNode(Node):
    def __init__(
        self,
        pipeline: Any,
        name: str = "vae_encoder",
        max_batch_size: int = 4,
        warmup_sizes: Sequence[Any] = (),
    ):
        self.pipeline = pipeline
        self.name = name
        self.max_batch_size = max_batch_size
        self.warmup_sizes = list(warmup_sizes)  # config compile sizes; None is the family's default

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # image sizes differ between requests
            self.pipeline.encode_image(request)

    @torch.inference_mode()
    def warmup(self) -> None:
        warmup_encode = getattr(self.pipeline, "warmup_encode", None)
        if warmup_encode is None:
            return
        for index, size in enumerate(self.warmup_sizes):
            warmup_encode(size, index)
        encoder = getattr(self.pipeline, "encoder", None)
        if encoder is not None and hasattr(encoder, "finish_warmup"):
            encoder.finish_warmup()

    def num_recompiles(self) -> int:
        encoder = getattr(self.pipeline, "encoder", None)
        return int(getattr(encoder, "num_recompiles", 0))


class DecodeNode(Node):
    def __init__(
        self,
        pipeline: Any,
        name: str = "vae_decoder",
        warmup_sizes: Sequence[Any] = (),
        max_batch_size: int = 4,
    ):
        self.pipeline = pipeline
        self.name = name
        self.warmup_sizes = list(warmup_sizes)  # config compile sizes; None is the family's default
        self.max_batch_size = max_batch_size
        self.sends_pieces = hasattr(pipeline, "decode_pieces")

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # sizes differ between requests; decode one at a time
            latents = request.tensors.pop(LATENTS)
            if request.emit_output is None or not self.sends_pieces:
                request.tensors[FRAMES] = self.pipeline.decode(latents)
                continue
            for frames in self.pipeline.decode_pieces(latents):  # uint8 [f, H, W, 3] on the host
                request.emit_output(FRAMES, frames)

    @torch.inference_mode()
    def warmup(self) -> None:
        for index, size in enumerate(self.warmup_sizes):
            self.pipeline.warmup_decode(size, index)
        decoder = getattr(self.pipeline, "decoder", None)
        if decoder is not None and hasattr(decoder, "finish_warmup"):
            decoder.finish_warmup()

    def num_recompiles(self) -> int:
        decoder = getattr(self.pipeline, "decoder", None)
        return int(getattr(decoder, "num_recompiles", 0))
