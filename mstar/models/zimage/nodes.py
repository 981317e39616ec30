"""Building Z-Image's nodes inside a worker: text_encoder (Qwen3), dit (the denoise loop) and
vae_decoder, from a diffusers folder (--model-path) or with seeded random weights."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mstar.config import CompileSize
from mstar.graph import BuildContext, Node, RequestState
from mstar.models.checkpoint import default_dtype
from mstar.models.zimage.config import ZImageConfig
from mstar.models.zimage.denoise import LATENTS, ZImageDenoiseNode, ZImageDenoiser, ZImageHooks, latent_size
from mstar.models.zimage.text_encoder import PromptEncoder, TextEncoderNode, build_qwen3
from mstar.models.zimage.vae import VAEDecoder
from mstar.models.zimage.weights import build_dit, build_vae_decoder, load_configs

logger = logging.getLogger(__name__)

FRAMES = "frames"
DEFAULT_WARMUP_SIZES = ((1024, 1024),)


def as_inference_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous inference-mode tensor. Dynamo guards on a tensor's dispatch keys, and inference
    tensors have others than normal ones: warmup latents are made in inference mode, the loop's
    final latents are not, and the difference alone recompiled the decode (seen on the H200)."""
    if tensor.is_inference() and tensor.is_contiguous():
        return tensor
    with torch.inference_mode():
        return tensor.clone(memory_format=torch.contiguous_format)


class CheckedCompiledDecode:
    """`vae.decode_frames` compiled with static shapes (one graph per latent size), its GroupNorms
    taking their statistics by pixel blocks. The first decode of each size also runs the eager
    decode and compares the uint8 frames: below MIN_FAST_PATH_PSNR_DB (a miscompile) that size
    decodes eagerly from then on, so wrong frames are never served. Compile mode "off" is the plain
    eager decode (F.group_norm)."""

    def __init__(self, vae: VAEDecoder, compile_mode: str):
        from mstar.diffusion.vae_decode import VAE_INDUCTOR_OPTIONS
        from mstar.engine.compile import CompiledFunction

        self.vae = vae
        self.compile_mode = compile_mode
        if compile_mode != "off":
            # Compiled, F.group_norm reduces each group in one long row; by pixel blocks the 1024x1024
            # decode took 27.3 ms against 35.2 on an H200 (mstar.bench.vae_profile). Set for good:
            # the compiled graph guards on it. The eager check and fallback below then use it too.
            vae.use_pixel_block_norms()
        # Static shapes: 35 ms vs 86 ms eager for 1024x1024 on an H200 (mstar.bench.stages).
        self.compiled = CompiledFunction(
            vae.decode_frames, compile_mode, "zimage_vae_decode", dynamic=False,
            extra_options=VAE_INDUCTOR_OPTIONS,
        )  # fmt: skip
        self.psnr_db_by_size: dict[tuple[int, int], float] = {}  # latent (h, w) -> compiled vs eager
        self.eager_sizes: set[tuple[int, int]] = set()  # sizes whose compiled frames were wrong

    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """latents float32 [C, h, w] -> uint8 [1, H, W, 3] on the same device."""
        size = (latents.shape[-2], latents.shape[-1])
        if self.compile_mode == "off" or size in self.eager_sizes:
            return self.vae.decode_frames(latents)
        frames = self.compiled(as_inference_tensor(latents))
        if size not in self.psnr_db_by_size:
            frames = self._check(size, latents, frames)
        return frames

    def _check(self, size: tuple[int, int], latents: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        from mstar.diffusion.vae_decode import MIN_FAST_PATH_PSNR_DB, uint8_psnr_db

        reference = self.vae.decode_frames(latents)
        psnr_db = self.psnr_db_by_size[size] = uint8_psnr_db(frames, reference)
        if psnr_db >= MIN_FAST_PATH_PSNR_DB:
            logger.info("VAE compiled decode at latents %s matches eager at %.1f dB", size, psnr_db)
            return frames
        logger.warning(
            "VAE compiled decode (compile_mode=%s) at latents %s disagrees with eager: PSNR %.1f dB "
            "< %.1f dB; decoding this size eagerly from now on",
            self.compile_mode, size, psnr_db, MIN_FAST_PATH_PSNR_DB,
        )  # fmt: skip
        self.eager_sizes.add(size)
        return reference

    def finish_warmup(self) -> None:
        """After the warmup sizes: a compile from now on (a new size) is a recompile."""
        self.compiled.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return self.compiled.num_recompiles


class VAEDecodeNode(Node):
    """Final latents -> request.tensors["frames"] uint8 [1, H, W, 3] on the device (compiled per
    size on GPU, see CheckedCompiledDecode)."""

    def __init__(
        self, vae: VAEDecoder, compile_mode: str = "off", warmup_sizes=(), name: str = "vae_decoder",
        max_batch_size: int = 4,
    ):  # fmt: skip
        self.vae = vae
        self.decode = CheckedCompiledDecode(vae, compile_mode)
        self.warmup_sizes = list(warmup_sizes)  # (width, height) pairs
        self.name = name
        self.max_batch_size = max_batch_size
        self.device = next(vae.parameters()).device

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:  # sizes differ between requests; one image is one decode
            # float32 as at warmup, so the compiled graph's dtype guard holds (the decode makes the
            # layout and tensor kind match too: as_inference_tensor).
            latents = request.tensors.pop(LATENTS).to(self.device, torch.float32)
            request.tensors[FRAMES] = self.decode(latents)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Compile and check each configured size on seeded random latents (zeros decode to
        near-flat frames that would hide a miscompile)."""
        from mstar.diffusion.noise import seeded_noise

        config = self.vae.config
        for index, (width, height) in enumerate(self.warmup_sizes):
            h, w = latent_size(height, width, config.spatial_scale)
            self.decode(seeded_noise((config.latent_channels, h, w), seed=index, device=self.device))
        self.decode.finish_warmup()

    def num_recompiles(self) -> int:
        return self.decode.num_recompiles


def warmup_sizes(compile_sizes: list[CompileSize]) -> list[tuple[int, int]]:
    """(width, height) of the config's compile sizes; 1024x1024 when none are named."""
    return [(size.width, size.height) for size in compile_sizes] or list(DEFAULT_WARMUP_SIZES)


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
    tokenizer = load_tokenizer(model_path, config)
    encoder = PromptEncoder(
        model, tokenizer, ctx.device, config.max_sequence_length, cuda_graphs=ctx.config.cuda_graphs
    )
    return TextEncoderNode(
        encoder,
        max_batch_size=ctx.config.max_batch_size,
        max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024,
    )


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
    from mstar.engine.kernels import triton_kernels_usable

    server = ctx.config
    dit = build_dit(config.dit, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    if server.fuse_projections and ctx.device.startswith("cuda"):
        dit.fuse_projections()  # after loading (diffusers' keys), before compile
        if server.triton_kernels and triton_kernels_usable(ctx.device):
            dit.use_qk_kernel()
            dit.use_norm_kernel()
    mode = effective_mode(server.compile_mode, ctx.device)
    dit.compile_layers(mode)
    sizes = warmup_sizes(server.compile_sizes) if server.warmup and mode != "off" else []
    return ZImageDenoiseNode(
        "dit", ZImageDenoiser(dit, attn, ctx.device), ZImageHooks(config, ctx.device), sizes,
        max_batch_size=server.max_batch_size, max_step_cost=server.max_tokens_per_step,
    )  # fmt: skip


def _vae_node(config: ZImageConfig, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.engine.compile import effective_mode

    server = ctx.config
    vae = build_vae_decoder(config.vae, ctx.device, dtype, model_path=model_path, progress=ctx.progress)
    mode = effective_mode(server.compile_mode, ctx.device)
    sizes = warmup_sizes(server.compile_sizes) if server.warmup and mode != "off" else []
    return VAEDecodeNode(vae, mode, sizes, max_batch_size=server.max_batch_size)
