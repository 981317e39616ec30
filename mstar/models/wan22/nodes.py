"""Building Wan2.2's nodes inside a worker: text_encoder (UMT5), dit (the denoise loop),
vae_encoder (image-to-video) and vae_decoder, from a diffusers folder or seeded random weights."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mstar.config import CompileSize
from mstar.graph import BuildContext, Node, RequestState
from mstar.models.checkpoint import build_module, component_path, default_dtype, read_config
from mstar.models.wan22.config import Wan22Config, WanDiTConfig
from mstar.models.wan22.denoise import (
    IMAGE_LATENTS,
    LATENTS,
    WanDenoiseNode,
    WanDenoiser,
    WanHooks,
    latent_shape,
)
from mstar.models.wan22.text_encoder import PromptEncoder, WanTextEncoderNode, build_umt5, load_tokenizer
from mstar.models.wan22.vae import (
    WanVAEDecoder,
    WanVAEEncoder,
    denormalize_latents,
    load_wan_vae,
    normalize_latents,
)
from mstar.models.wan22.vae_config import WanVAEConfig

FRAMES = "frames"
INPUT_REFERENCE = "input_reference"  # uint8 [H, W, 3] image from the API


def image_to_video_input(image: Any, width: int, height: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> float [1, 3, 1, height, width] in [-1, 1], resized (Lanczos) like diffusers."""
    import numpy as np
    from PIL import Image

    pixels = image.cpu().numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    picture = Image.fromarray(pixels.astype(np.uint8))
    if picture.size != (width, height):
        picture = picture.resize((width, height), resample=Image.LANCZOS)
    array = torch.from_numpy(np.asarray(picture, dtype=np.float32) / 255.0)  # [H, W, 3] in [0, 1]
    return (array * 2 - 1).permute(2, 0, 1)[None, :, None]


logger = logging.getLogger(__name__)


class WanVAEEncodeNode(Node):
    """input_reference image -> request.tensors["image_latents"] (normalised [z, 1, h, w], float32).
    `vae` is the encoder-only copy (a full WanVAE encodes the same)."""

    def __init__(self, vae: WanVAEEncoder, name: str = "vae_encoder", max_batch_size: int = 4):
        self.vae = vae
        self.name = name
        self.max_batch_size = max_batch_size
        self.device = next(vae.parameters()).device
        self.dtype = next(vae.parameters()).dtype

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # image sizes differ between requests
            params = request.params
            if INPUT_REFERENCE not in request.tensors:
                raise ValueError(
                    f"request {request.request_id}: image-to-video needs an '{INPUT_REFERENCE}' image"
                )
            image = request.tensors.pop(INPUT_REFERENCE)
            video = image_to_video_input(image, params.width, params.height)
            latents = self.vae.encode(video.to(self.device, self.dtype)).float()
            request.tensors[IMAGE_LATENTS] = normalize_latents(latents, self.vae.config)[0]


class WanVAEDecodeNode(Node):
    """Final latents -> request.tensors["frames"] uint8 [F, H, W, 3] (VaeDecodeRunner: channels-last,
    compiled on GPU for clips). Where the runtime takes pieces (request.emit_output), the frames go
    out chunk by chunk as they decode, so the MP4 muxer works while the rest of the clip decodes."""

    def __init__(self, runner, config, warmup_shapes=(), name: str = "vae_decoder", max_batch_size: int = 4):
        self.runner = runner  # mstar.diffusion.vae_decode.VaeDecodeRunner
        self.config = config  # WanVAEConfig (latents_mean / latents_std)
        self.warmup_shapes = list(warmup_shapes)
        self.name = name
        self.max_batch_size = max_batch_size

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # clip sizes differ between requests; decode one at a time
            latents = request.tensors.pop(LATENTS).to(self.runner.device, torch.float32)[None]
            vae_latents = denormalize_latents(latents, self.config).to(self.runner.dtype)
            if request.emit_output is None:
                request.tensors[FRAMES] = self.runner.decode_uint8(vae_latents)
                continue
            for frames in self.runner.iter_host_uint8(vae_latents):  # uint8 [f, H, W, 3] on the host
                request.emit_output(FRAMES, frames)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Compile each configured shape, then check the compiled clip path against the plain decode
        on seeded random latents (zeros decode to near-flat frames and would hide a miscompile)."""
        from mstar.diffusion.noise import seeded_noise

        for index, shape in enumerate(self.warmup_shapes):
            latents = seeded_noise((1, *shape), seed=index).to(self.runner.device, self.runner.dtype)
            self.runner.decode_uint8(latents)
            if shape[1] > 1:  # latent frames: clips take the fast path, single images the plain one
                psnr_db = self.runner.verify_fast_path(latents)
                logger.info("VAE fast decode %s matches the plain decode at %.1f dB", shape, psnr_db)
        self.runner.finish_warmup()

    def num_recompiles(self) -> int:
        return self.runner.num_recompiles


def load_config(model_path: str | None, default: Wan22Config) -> Wan22Config:
    """Component configs from the folder's config.json files (the defaults where absent)."""
    if model_path is None:
        return default
    dit = WanDiTConfig.from_dict(read_config(component_path(model_path, "transformer")))
    vae = read_config(component_path(model_path, "vae"))
    text = read_config(component_path(model_path, "text_encoder"))
    return replace(default, dit=dit, vae=vae, text_encoder=text)


def build_nodes(default_config: Wan22Config, ctx: BuildContext) -> dict[str, Node]:
    if ctx.model_path is None and not ctx.random_weights:
        raise ValueError("wan2.2-ti2v-5b needs --model-path (a diffusers folder) or --random-weights")
    model_path = None if ctx.random_weights else ctx.model_path
    config = load_config(model_path, default_config)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {"text_encoder": _text_node, "dit": _dit_node, "vae_encoder": _vae_encoder_node}
    builders["vae_decoder"] = _vae_decoder_node
    nodes: dict[str, Node] = {}
    for name in ctx.node_names:
        if name not in builders:
            raise ValueError(f"wan2.2 has no node '{name}'")
        nodes[name] = builders[name](config, ctx, model_path, dtype)
    return nodes


def _folder(model_path: str | None, component: str) -> str | None:
    return None if model_path is None else str(component_path(model_path, component))


def _text_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    folder = _folder(model_path, "text_encoder")
    model = build_umt5(config.text_encoder, ctx.device, dtype, folder=folder, progress=ctx.progress)
    tokenizer_dir = None if model_path is None else str(Path(model_path) / "tokenizer")
    tokenizer = load_tokenizer(tokenizer_dir, config.text_encoder["vocab_size"])
    # A text encoder placed on the CPU holds no GPU memory: streaming would only copy its weights.
    offload = ctx.config.offload_text_encoder and ctx.device.startswith("cuda")
    if ctx.config.offload_text_encoder and not offload:
        logger.info("offload_text_encoder: the text encoder runs on %s, nothing to offload", ctx.device)
    encoder = PromptEncoder(
        model,
        tokenizer,
        ctx.device,
        config.max_text_tokens,
        offload=offload,
        cuda_graphs=ctx.config.cuda_graphs,
    )
    return WanTextEncoderNode(
        encoder,
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


def _dit_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.engine.attention import build_attention
    from mstar.engine.compile import effective_mode
    from mstar.engine.kernels import triton_kernels_usable
    from mstar.models.wan22.dit import WanDiT

    server = ctx.config
    dit = build_module(
        lambda: WanDiT(config.dit), ctx.device, dtype, folder=_folder(model_path, "transformer"),
        keep_fp32=WanDiT.fp32_param_patterns, progress=ctx.progress,
    )  # fmt: skip
    if server.fuse_projections and ctx.device.startswith("cuda"):
        dit.fuse_projections()  # after loading (diffusers' keys), before compile
        if server.triton_kernels and triton_kernels_usable(ctx.device):
            dit.use_qk_kernel()
            dit.use_norm_kernel()
    mode = effective_mode(server.compile_mode, ctx.device)
    dit.compile_layers(mode)
    attention = build_attention(
        backend=server.attention_backend, device=ctx.device, dtype=dtype,
        flashinfer_backend=server.flashinfer_backend, workspace_mb=server.workspace_mb,
    )  # fmt: skip
    shapes = _warmup_shapes(config, server.compile_sizes) if server.warmup and mode != "off" else []
    return WanDenoiseNode(
        WanDenoiser(dit, attention), WanHooks(config, ctx.device, dtype), shapes,
        max_batch_size=server.max_batch_size, max_step_cost=server.max_tokens_per_step,
    )  # fmt: skip


def _warmup_shapes(config: Wan22Config, compile_sizes: list[CompileSize]) -> list[tuple[int, int, int, int]]:
    """Latent shapes for the config's compile sizes (the model defaults when none)."""
    shapes = []
    for size in compile_sizes or [CompileSize(width=config.default_width, height=config.default_height)]:
        frames = size.num_frames or config.default_num_frames
        shapes.append(latent_shape(config, size.width, size.height, frames))
    return shapes


def _vae_config(config: Wan22Config) -> WanVAEConfig:
    return WanVAEConfig.from_dict(config.vae)


def _vae_encoder_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    if model_path is not None:
        vae = load_wan_vae(_folder(model_path, "vae"), device=ctx.device, dtype=dtype, encoder_only=True)
    else:
        vae = build_module(
            lambda: WanVAEEncoder(_vae_config(config)), ctx.device, dtype, progress=ctx.progress
        )
    return WanVAEEncodeNode(vae)


def _vae_decoder_node(config: Wan22Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_decode import VaeDecodeRunner
    from mstar.engine.compile import effective_mode

    if model_path is not None:
        vae = load_wan_vae(_folder(model_path, "vae"), device=ctx.device, dtype=dtype, decoder_only=True)
    else:
        vae = build_module(
            lambda: WanVAEDecoder(_vae_config(config)), ctx.device, dtype, progress=ctx.progress
        )
    server = ctx.config
    mode = effective_mode(server.compile_mode, ctx.device)
    shapes = _warmup_shapes(config, server.compile_sizes) if server.warmup and mode != "off" else []
    return WanVAEDecodeNode(VaeDecodeRunner(vae, compile_mode=mode), vae.config, shapes)
