"""Building FLUX.2 [klein]'s nodes inside a worker from a diffusers folder (--model-path) or with
seeded random weights: text_encoder (Qwen3), vae_encoder (reference images), dit (the denoise
loop) and vae_decoder, each the shared node over a Flux2KleinPipeline holding that component. The
VAE's encode and decode are compiled and checked per size when compiling (vae_compile.py); the
encoder, the DiT and the decoder warm up at the configured sizes (edits' reference tokens too).

The spec's name says whether the checkpoint is step-distilled (the API validates with it before
any worker reads a folder), so a folder whose model_index.json says otherwise is refused at boot."""

from __future__ import annotations

import dataclasses

from mstar.graph import BuildContext, Node
from mstar.models.checkpoint import default_dtype
from mstar.models.flux2_klein.config import Flux2KleinConfig, load_config
from mstar.models.flux2_klein.pipeline import Flux2KleinPipeline
from mstar.models.scaffold import build_dit_node, build_named_nodes, checkpoint_folder, warmup_sizes


def served_config(spec_config: Flux2KleinConfig, model_path: str | None, model_name: str) -> Flux2KleinConfig:
    """The folder's configs (the spec's preset with random weights), its prompt settings the spec's."""
    if model_path is None:
        return spec_config
    config = load_config(model_path, spec_config)
    if config.is_distilled != spec_config.is_distilled:
        kind = "step-distilled" if config.is_distilled else "undistilled (base)"
        raise ValueError(
            f"{model_path} is a {kind} checkpoint (model_index.json is_distilled={config.is_distilled}); "
            f"{model_name} serves {'distilled' if spec_config.is_distilled else 'base'} ones"
        )
    return dataclasses.replace(config, max_sequence_length=spec_config.max_sequence_length)


def build_nodes(spec_config: Flux2KleinConfig, ctx: BuildContext, model_name: str) -> dict[str, Node]:
    model_path = checkpoint_folder(ctx, model_name)
    config = served_config(spec_config, model_path, model_name)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {
        "text_encoder": lambda: _text_node(config, ctx, model_path, dtype),
        "vae_encoder": lambda: _vae_encoder_node(config, ctx, model_path, dtype),
        "dit": lambda: _dit_node(config, ctx, model_path, dtype),
        "vae_decoder": lambda: _vae_decoder_node(config, ctx, model_path, dtype),
    }
    return build_named_nodes(ctx, model_name, builders)


def _text_node(config: Flux2KleinConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.flux2_klein.text_encoder import PromptEncoder, build_qwen3
    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.text_fallback import load_tokenizer

    folder = None if model_path is None else f"{model_path}/text_encoder"
    out_layers = config.text_encoder_out_layers
    model = build_qwen3(config.text_encoder, ctx.device, dtype, path=folder, out_layers=out_layers)
    tokenizer_dir = None if model_path is None else f"{model_path}/tokenizer"
    # Qwen's tokenizer adds no special tokens to text; the chat markers carry the structure.
    tokenizer = load_tokenizer(
        tokenizer_dir, config.text_encoder["vocab_size"], config.max_sequence_length, add_eos=False
    )
    encoder = PromptEncoder(
        model, tokenizer, ctx.device, out_layers, config.max_sequence_length,
        int(config.text_encoder["num_hidden_layers"]),
    )  # fmt: skip
    return PromptEmbedsNode(
        Flux2KleinPipeline(config, ctx.device, text_encoder=encoder),
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


def _vae_encoder_node(config: Flux2KleinConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import ImageEncodeNode
    from mstar.engine.compile import effective_mode
    from mstar.models.flux2_klein.vae_compile import checked_encode
    from mstar.models.flux2_klein.weights import build_vae_encoder

    encoder = build_vae_encoder(config.vae, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    pipeline = Flux2KleinPipeline(
        config, ctx.device, vae_encoder=encoder, encoder=checked_encode(encoder, mode)
    )
    return ImageEncodeNode(
        pipeline, warmup_sizes=warmup_sizes(ctx.config, mode), max_batch_size=ctx.config.max_batch_size
    )


def _dit_node(config: Flux2KleinConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.flux2_klein.weights import build_dit

    def load():
        return build_dit(config.transformer, ctx.device, dtype, model_path=model_path, progress=ctx.progress)

    from mstar.models.flux2_klein.optimize import optimize

    def pipeline(dit, attention) -> Flux2KleinPipeline:
        return Flux2KleinPipeline(config, ctx.device, dit=dit, attention=attention)

    return build_dit_node(ctx, dtype, "flux2.dit", load=load, pipeline=pipeline, optimize=optimize)


def _vae_decoder_node(config: Flux2KleinConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.engine.compile import effective_mode
    from mstar.models.flux2_klein.vae_compile import checked_decode
    from mstar.models.flux2_klein.weights import build_vae_decoder

    vae = build_vae_decoder(config.vae, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    pipeline = Flux2KleinPipeline(config, ctx.device, vae=vae, decoder=checked_decode(vae, mode))
    return DecodeNode(
        pipeline, warmup_sizes=warmup_sizes(ctx.config, mode), max_batch_size=ctx.config.max_batch_size
    )
