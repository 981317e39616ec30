"""Building Z-Image's nodes inside a worker from a diffusers folder (--model-path) or with seeded
random weights: text_encoder (Qwen3), dit (the denoise loop) and vae_decoder, each the shared node
over a ZImagePipeline holding that node's component."""

from __future__ import annotations

import torch

from mstar.graph import BuildContext, Node
from mstar.models.checkpoint import default_dtype
from mstar.models.scaffold import build_dit_node, build_named_nodes, checkpoint_folder, warmup_sizes
from mstar.models.zimage.config import ZImageConfig
from mstar.models.zimage.pipeline import ZImagePipeline
from mstar.models.zimage.weights import build_dit, build_vae_decoder, load_configs

MODEL_NAME = "z-image-turbo"


def as_inference_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous inference-mode tensor. Dynamo guards on a tensor's dispatch keys, and inference
    tensors have others than normal ones: warmup latents are made in inference mode, the loop's
    final latents are not, and the difference alone recompiled the decode (seen on the H200)."""
    if tensor.is_inference() and tensor.is_contiguous():
        return tensor
    with torch.inference_mode():
        return tensor.clone(memory_format=torch.contiguous_format)


def build_nodes(default_config: ZImageConfig, ctx: BuildContext) -> dict[str, Node]:
    model_path = checkpoint_folder(ctx, MODEL_NAME)
    config = load_configs(model_path, default_config)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {
        "text_encoder": lambda: _text_node(config, ctx, model_path, dtype),
        "dit": lambda: _dit_node(config, ctx, model_path, dtype),
        "vae_decoder": lambda: _vae_node(config, ctx, model_path, dtype),
    }
    return build_named_nodes(ctx, MODEL_NAME, builders)


def _text_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.text_encoding import PromptEmbedsNode
    from mstar.models.text_fallback import load_tokenizer
    from mstar.models.zimage.text_encoder import Qwen3PromptEncoder, build_qwen3

    folder = None if model_path is None else f"{model_path}/text_encoder"
    progress = ctx.progress or (lambda label, done, total: None)
    progress("loading text_encoder", 0, 1)  # transformers loads it: one bar for the whole module
    model = build_qwen3(config.text_encoder, ctx.device, dtype, path=folder)
    progress("loading text_encoder", 1, 1)
    tokenizer_dir = None if model_path is None else f"{model_path}/tokenizer"
    # Qwen's tokenizer adds no special tokens to text; the chat markers carry the structure.
    tokenizer = load_tokenizer(
        tokenizer_dir, config.text_encoder["vocab_size"], config.max_sequence_length, add_eos=False
    )
    encoder = Qwen3PromptEncoder(
        model, tokenizer, ctx.device, config.max_sequence_length, cuda_graphs=ctx.config.cuda_graphs
    )
    return PromptEmbedsNode(
        ZImagePipeline(config, ctx.device, text_encoder=encoder),
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


def _dit_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.models.zimage.lora import zimage_lora_targets
    from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS
    from mstar.models.zimage.optimize import optimize

    def load():
        return build_dit(config.dit, ctx.device, dtype, model_path=model_path, progress=ctx.progress)

    def pipeline(dit, attention) -> ZImagePipeline:
        return ZImagePipeline(config, ctx.device, dit=dit, attention=attention)

    return build_dit_node(
        ctx, dtype, "zimage.dit", load=load, pipeline=pipeline, optimize=optimize,
        lora_targets=zimage_lora_targets, lora_keys=ZIMAGE_LORA_KEYS,
    )  # fmt: skip


def _vae_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.engine.compile import effective_mode

    vae = build_vae_decoder(config.vae, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    pipeline = ZImagePipeline(config, ctx.device, vae=vae, decoder=checked_decode(vae, mode))
    return DecodeNode(
        pipeline, warmup_sizes=warmup_sizes(ctx.config, mode), max_batch_size=ctx.config.max_batch_size
    )


def checked_decode(vae, compile_mode: str, compiler=None):
    """`vae.decode_frames` compiled with static shapes (one graph per latent size; 35 ms vs 86 eager
    at 1024x1024 on an H200), its GroupNorms taking their statistics by pixel blocks (compiled,
    F.group_norm reduced each group in one long row: 27.3 ms against 35.2). A size decodes compiled
    only once its compile was checked against the eager decode (mstar.engine.checked_compile: inline
    at warmup, off the serving path for any other size, which decodes eagerly meanwhile); a
    miscompiled size stays eager. None for compile mode "off": the plain eager decode (F.group_norm)."""
    if compile_mode == "off":
        return None
    from mstar.diffusion.noise import seeded_noise
    from mstar.diffusion.vae_decode import VAE_INDUCTOR_OPTIONS
    from mstar.engine.checked_compile import CheckedFunction
    from mstar.engine.compile import CompiledFunction

    vae.use_pixel_block_norms()  # for good: the compiled graph guards on it, and eager then uses it too
    compiled = CompiledFunction(
        vae.decode_frames,
        compile_mode,
        "zimage_vae_decode",
        dynamic=False,
        extra_options=VAE_INDUCTOR_OPTIONS,
    )
    device = next(vae.parameters()).device

    def example(size: tuple[int, int]) -> tuple[torch.Tensor]:  # seeded: zeros would hide a miscompile
        return (seeded_noise((vae.config.latent_channels, *size), seed=0, device=device),)

    return CheckedFunction(
        "zimage_vae_decode", lambda latents: compiled(as_inference_tensor(latents)), vae.decode_frames,
        key=lambda latents: tuple(latents.shape[-2:]), example=example, parts=[compiled], compiler=compiler,
    )  # fmt: skip
