"""Building LTX-2's nodes inside a worker from a diffusers folder or seeded random weights:
text_encoder (Gemma 3 + connectors), dit (the denoise loop), vae_encoder (image-to-video's first
frame), audio_decoder (audio VAE decoder + vocoder: this family's node) and vae_decoder, each the
shared node over an LTX2Pipeline holding that node's components."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mstar.graph import BuildContext, Node, RequestState
from mstar.models.checkpoint import component_path, default_dtype
from mstar.models.ltx2 import weights
from mstar.models.ltx2.config import LTX2Config
from mstar.models.ltx2.pipeline import AUDIO, AUDIO_LATENTS, LTX2Pipeline
from mstar.models.scaffold import build_dit_node, build_named_nodes, checkpoint_folder, warmup_sizes

logger = logging.getLogger(__name__)
MODEL_NAME = "ltx-2"


class AudioDecodeNode(Node):
    """The loop's final audio latents -> request.tensors["audio"] (float32 [channels, samples] on
    the host), one request at a time (durations differ)."""

    def __init__(self, pipeline: LTX2Pipeline, name: str = "audio_decoder", max_batch_size: int = 4):
        self.pipeline = pipeline
        self.name = name
        self.max_batch_size = max_batch_size

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            request.tensors[AUDIO] = self.pipeline.decode_audio(request.tensors.pop(AUDIO_LATENTS))


def build_nodes(default_config: LTX2Config, ctx: BuildContext) -> dict[str, Node]:
    model_path = checkpoint_folder(ctx, MODEL_NAME)
    config = weights.load_configs(model_path, default_config)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {
        "text_encoder": lambda: _text_node(config, ctx, model_path, dtype),
        "dit": lambda: _dit_node(config, ctx, model_path, dtype),
        "vae_encoder": lambda: _vae_encoder_node(config, ctx, model_path, dtype),
        "audio_decoder": lambda: _audio_node(config, ctx, model_path, dtype),
        "vae_decoder": lambda: _vae_decoder_node(config, ctx, model_path, dtype),
    }
    return build_named_nodes(ctx, MODEL_NAME, builders)


def _pipeline(config: LTX2Config, ctx: BuildContext, dtype, **components) -> LTX2Pipeline:
    return LTX2Pipeline(config, ctx.device, dtype, **components)


def _text_node(config: LTX2Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.engine.resources import build_engine_resources
    from mstar.models.ltx2.text_encoder import PromptEncoder, build_gemma3
    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.text_fallback import load_tokenizer

    max_length = config.defaults.max_sequence_length
    folder = None if model_path is None else str(component_path(model_path, "text_encoder"))
    gemma = build_gemma3(config.text_encoder, ctx.device, dtype, path=folder)
    tokenizer_dir = None if model_path is None else str(Path(model_path) / "tokenizer")
    vocab_size = config.text_encoder.get("text_config", {}).get("vocab_size", 262208)
    tokenizer = load_tokenizer(tokenizer_dir, vocab_size, max_length)
    connectors = weights.build_connectors(
        config.connectors, ctx.device, dtype, model_path, progress=ctx.progress
    )
    attention = build_engine_resources(ctx.config, ctx.device, dtype).attention
    encoder = PromptEncoder(gemma, tokenizer, connectors, attention, ctx.device, max_length)
    return PromptEmbedsNode(
        _pipeline(config, ctx, dtype, text_encoder=encoder),
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


def _dit_node(config: LTX2Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.ltx2.optimize import optimize

    def load():
        return weights.build_dit(config.dit, ctx.device, dtype, model_path, progress=ctx.progress)

    def pipeline(dit, attention) -> LTX2Pipeline:
        return _pipeline(config, ctx, dtype, dit=dit, attention=attention)

    return build_dit_node(ctx, dtype, "ltx2.dit", load=load, pipeline=pipeline, optimize=optimize)


def _vae_encoder_node(config: LTX2Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import ImageEncodeNode

    vae = weights.build_video_vae(
        config.vae, ctx.device, dtype, model_path, decoder=False, progress=ctx.progress
    )
    return ImageEncodeNode(_pipeline(config, ctx, dtype, vae=vae))


def _audio_node(config: LTX2Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    audio_decoder = weights.build_audio_decoder(
        config.audio_vae, ctx.device, dtype, model_path, progress=ctx.progress
    )
    vocoder = weights.build_vocoder(config.vocoder, ctx.device, dtype, model_path, progress=ctx.progress)
    return AudioDecodeNode(_pipeline(config, ctx, dtype, audio_decoder=audio_decoder, vocoder=vocoder))


def _vae_decoder_node(config: LTX2Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.engine.compile import effective_mode

    vae = weights.build_video_vae(
        config.vae, ctx.device, dtype, model_path, encoder=False, progress=ctx.progress
    )
    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    return DecodeNode(_pipeline(config, ctx, dtype, vae=vae), warmup_sizes=warmup_sizes(ctx.config, mode))
