"""Building Wan2.2's nodes inside a worker from a diffusers folder or seeded random weights:
text_encoder (UMT5), dit (the denoise loop), vae_encoder (image-to-video) and vae_decoder, each the
shared node over a WanPipeline holding that node's component."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from mstar.diffusion.scheduler_config import UniPCConfig
from mstar.graph import BuildContext, Node
from mstar.models.checkpoint import build_module, component_path, default_dtype, read_config
from mstar.models.scaffold import build_dit_node, build_named_nodes, checkpoint_folder, warmup_sizes
from mstar.models.wan22.config import Wan22Config, WanDiTConfig
from mstar.models.wan22.pipeline import WanPipeline
from mstar.models.wan22.vae_config import WanVAEConfig

logger = logging.getLogger(__name__)
MODEL_NAME = "wan2.2-ti2v-5b"


def load_config(model_path: str | None, default: Wan22Config) -> Wan22Config:
    """Component configs from the folder's config.json files (the defaults where absent)."""
    if model_path is None:
        return default
    dit = WanDiTConfig.from_dict(read_config(component_path(model_path, "transformer")))
    vae = read_config(component_path(model_path, "vae"))
    text = read_config(component_path(model_path, "text_encoder"))
    scheduler = default.scheduler
    if (Path(model_path) / "scheduler").is_dir():
        scheduler_json = read_config(component_path(model_path, "scheduler"), "scheduler_config.json")
        scheduler = UniPCConfig.from_dict(scheduler_json)
    return replace(default, dit=dit, vae=vae, text_encoder=text, scheduler=scheduler)


def build_nodes(default_config: Wan22Config, ctx: BuildContext) -> dict[str, Node]:
    model_path = checkpoint_folder(ctx, MODEL_NAME)
    config = load_config(model_path, default_config)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {
        "text_encoder": lambda: _text_node(config, ctx, model_path, dtype),
        "dit": lambda: _dit_node(config, ctx, model_path, dtype),
        "vae_encoder": lambda: _vae_encoder_node(config, ctx, model_path, dtype),
        "vae_decoder": lambda: _vae_decoder_node(config, ctx, model_path, dtype),
    }
    return build_named_nodes(ctx, MODEL_NAME, builders)


def _folder(model_path: str | None, component: str) -> str | None:
    return None if model_path is None else str(component_path(model_path, component))


def _text_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.text_fallback import load_tokenizer
    from mstar.models.wan22.text_encoder import UMT5PromptEncoder, build_umt5

    model = build_umt5(config.text_encoder, ctx.device, dtype, folder=_folder(model_path, "text_encoder"),
                       progress=ctx.progress)  # fmt: skip
    tokenizer_dir = None if model_path is None else str(Path(model_path) / "tokenizer")
    tokenizer = load_tokenizer(tokenizer_dir, config.text_encoder["vocab_size"], config.max_text_tokens)
    # A text encoder placed on the CPU holds no GPU memory: streaming would only copy its weights.
    offload = ctx.config.offload_text_encoder and ctx.device.startswith("cuda")
    if ctx.config.offload_text_encoder and not offload:
        logger.info("offload_text_encoder: the text encoder runs on %s, nothing to offload", ctx.device)
    encoder = UMT5PromptEncoder(
        model,
        tokenizer,
        ctx.device,
        config.max_text_tokens,
        cuda_graphs=ctx.config.cuda_graphs,
        offload=offload,
    )
    return PromptEmbedsNode(
        WanPipeline(config, ctx.device, dtype, text_encoder=encoder),
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


def _dit_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.wan22.dit import WanDiT
    from mstar.models.wan22.lora import wan_lora_targets
    from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
    from mstar.models.wan22.optimize import optimize

    def load() -> WanDiT:
        return build_module(
            lambda: WanDiT(config.dit), ctx.device, dtype, folder=_folder(model_path, "transformer"),
            keep_fp32=WanDiT.fp32_param_patterns, progress=ctx.progress,
        )  # fmt: skip

    def pipeline(dit: WanDiT, attention) -> WanPipeline:
        return WanPipeline(config, ctx.device, dtype, dit=dit, attention=attention)

    return build_dit_node(
        ctx, dtype, "wan.dit", load=load, pipeline=pipeline, optimize=optimize,
        lora_targets=wan_lora_targets, lora_keys=WAN22_LORA_KEYS,
    )  # fmt: skip


def _vae_encoder_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import ImageEncodeNode
    from mstar.models.wan22.vae import WanVAEEncoder, load_wan_vae

    if model_path is not None:
        vae = load_wan_vae(_folder(model_path, "vae"), device=ctx.device, dtype=dtype, encoder_only=True)
    else:
        vae_config = WanVAEConfig.from_dict(config.vae)
        vae = build_module(lambda: WanVAEEncoder(vae_config), ctx.device, dtype, progress=ctx.progress)
    return ImageEncodeNode(WanPipeline(config, ctx.device, dtype, vae_encoder=vae))


def _vae_decoder_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_decode import VaeDecodeRunner
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.engine.compile import effective_mode
    from mstar.models.wan22.vae import WanVAEDecoder, load_wan_vae

    if model_path is not None:
        vae = load_wan_vae(_folder(model_path, "vae"), device=ctx.device, dtype=dtype, decoder_only=True)
    else:
        vae_config = WanVAEConfig.from_dict(config.vae)
        vae = build_module(lambda: WanVAEDecoder(vae_config), ctx.device, dtype, progress=ctx.progress)
    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    decoder = VaeDecodeRunner(vae, compile_mode=mode)
    pipeline = WanPipeline(config, ctx.device, dtype, decoder=decoder)
    return DecodeNode(pipeline, warmup_sizes=warmup_sizes(ctx.config, mode))
