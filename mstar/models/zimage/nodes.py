"""Building Z-Image's nodes inside a worker: text_encoder (Qwen3), dit (the denoise loop) and
vae_decoder, from a diffusers folder (--model-path) or with seeded random weights."""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.graph import BuildContext, Node, RequestState
from mstar.models.checkpoint import default_dtype
from mstar.models.zimage.config import ZImageConfig
from mstar.models.zimage.denoise import LATENTS, ZImageDenoiseNode, ZImageDenoiser, ZImageHooks
from mstar.models.zimage.text_encoder import PromptEncoder, TextEncoderNode, build_qwen3
from mstar.models.zimage.weights import build_dit, build_vae_decoder, load_configs

FRAMES = "frames"
DEFAULT_WARMUP_SIZES = ((1024, 1024),)


class VAEDecodeNode(Node):
    """Final latents -> request.tensors["frames"] uint8 [1, H, W, 3] on the device."""

    def __init__(self, vae, name: str = "vae_decoder", max_batch_size: int = 4):
        self.vae = vae
        self.name = name
        self.max_batch_size = max_batch_size
        self.device = next(vae.parameters()).device

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # sizes differ between requests; one image is one decode
            latents = request.tensors.pop(LATENTS)
            request.tensors[FRAMES] = self.vae.decode_frames(latents.to(self.device))


def warmup_sizes(compile_sizes: list[str]) -> list[tuple[int, int]]:
    """(width, height) from the config's "WxH" compile sizes; 1024x1024 when none are named."""
    sizes = [tuple(int(n) for n in size.split("x")[:2]) for size in compile_sizes]
    return sizes or list(DEFAULT_WARMUP_SIZES)


def build_nodes(default_config: ZImageConfig, ctx: BuildContext) -> dict[str, Node]:
    if ctx.model_path is None and not ctx.random_weights:
        raise ValueError("z-image-turbo needs --model-path (a diffusers folder) or --random-weights")
    model_path = None if ctx.random_weights else ctx.model_path
    config = load_configs(model_path, default_config)
    server = ctx.config
    dtype = default_dtype(ctx.device, server.dtype)
    attn = None
    if "dit" in ctx.node_names:
        from mstar.engine.resources import build_engine_resources

        # Workspace and attention backend before any weights take memory; boot fails fast on a bad backend.
        attn = build_engine_resources(server, ctx.device, dtype).attention
    nodes: dict[str, Node] = {}
    for index, name in enumerate(ctx.node_names):
        if ctx.progress is not None:
            ctx.progress(f"load {name}", index, len(ctx.node_names))
        if name == "text_encoder":
            nodes[name] = _text_node(config, ctx, model_path, dtype)
        elif name == "dit":
            nodes[name] = _dit_node(config, ctx, model_path, dtype, attn)
        else:
            nodes[name] = _vae_node(config, ctx, model_path, dtype)
    return nodes


def _text_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    folder = None if model_path is None else str(Path(model_path) / "text_encoder")
    model = build_qwen3(config.text_encoder, ctx.device, dtype, path=folder)
    encoder = PromptEncoder(model, load_tokenizer(model_path, config), ctx.device, config.max_sequence_length)
    return TextEncoderNode(encoder, max_batch_size=ctx.config.max_batch_size)


def load_tokenizer(model_path: str | None, config: ZImageConfig):
    """The folder's tokenizer/, else the deterministic fallback (random weights, no downloads)."""
    if model_path is not None and (Path(model_path) / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(Path(model_path) / "tokenizer"))
    from mstar.models.text_fallback import FallbackTokenizer

    # Qwen's tokenizer adds no special tokens to text; the chat markers carry the structure.
    return FallbackTokenizer(config.text_encoder["vocab_size"], config.max_sequence_length, add_eos=False)


def _dit_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype, attn) -> Node:
    from mstar.engine.compile import effective_mode

    server = ctx.config
    dit = build_dit(config.dit, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    if server.fuse_projections and ctx.device.startswith("cuda"):
        dit.fuse_projections()  # after loading (diffusers' keys), before compile
    mode = effective_mode(server.compile_mode, ctx.device)
    dit.compile_layers(mode)
    sizes = warmup_sizes(server.compile_sizes) if server.warmup and mode != "off" else []
    return ZImageDenoiseNode(
        "dit", ZImageDenoiser(dit, attn, ctx.device), ZImageHooks(config, ctx.device), sizes,
        max_batch_size=server.max_batch_size, max_step_cost=server.max_tokens_per_step,
    )  # fmt: skip


def _vae_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    vae = build_vae_decoder(config.vae, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    return VAEDecodeNode(vae, max_batch_size=ctx.config.max_batch_size)
