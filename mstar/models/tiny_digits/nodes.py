"""The tiny digits nodes: text_encoder, dit (the shared DenoiseNode over the Wan DiT) and decoder.

Request tensors (per request, on the worker):
  prompt_embeds / negative_prompt_embeds  float32 [L, text_dim]  (text_encoder)
  latents                                 float32 [1, 1, 16, 16] pixels in [-1, 1] (dit)
  frames                                  uint8 [1, 256, 256, 3], dark ink on white (decoder)
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from mstar.diffusion.denoise import COND, DenoiseItem, DenoiseNode, DenoiseStart
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, linear_sigmas
from mstar.graph import BuildContext, Node, RequestState
from mstar.models.checkpoint import default_dtype
from mstar.models.tiny_digits.config import (
    CONFIG_FILE,
    DIT_FILE,
    TEXT_ENCODER_FILE,
    VOCAB_FILE,
    WEIGHTS_DIR,
    TinyDigitsConfig,
)
from mstar.models.tiny_digits.text import WordTokenizer, make_text_encoder
from mstar.models.wan22.config import WanDiTConfig
from mstar.models.wan22.dit import DiTInput, WanDiT

PROMPT_EMBEDS, NEGATIVE_PROMPT_EMBEDS = "prompt_embeds", "negative_prompt_embeds"
LATENTS, FRAMES = "latents", "frames"
MAX_BATCH_SIZE = 64  # a step of 64 requests is 2 * 64 * 16 tokens: nothing for any device


class TextEncoderNode(Node):
    """Prompt and negative prompt -> embeddings, one prompt at a time (a few words each, so the
    per-request loop costs nothing and no request's embedding depends on its batch company)."""

    def __init__(self, encoder: torch.nn.Module, tokenizer: WordTokenizer, device: torch.device):
        self.name = "text_encoder"
        self.max_batch_size = MAX_BATCH_SIZE
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.device = device

    def encode(self, prompt: str) -> torch.Tensor:
        ids = torch.tensor([self.tokenizer.encode(prompt)], device=self.device)  # [1, L]
        padding_mask = torch.zeros_like(ids, dtype=torch.bool)
        return self.encoder(ids, padding_mask)[0].float()  # [L, text_dim]

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            request.tensors[PROMPT_EMBEDS] = self.encode(request.params.prompt)
            request.tensors[NEGATIVE_PROMPT_EMBEDS] = self.encode(request.params.negative_prompt)


class DigitsDenoiser:
    """The Wan DiT over every (request, label) of a step: one packed forward."""

    def __init__(self, dit: WanDiT, attention):
        self.dit = dit
        self.attention = attention

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        inputs = [DiTInput(item.latents, item.timestep, item.text) for item in items]
        return [velocity.float() for velocity in self.dit(inputs, self.attention)]


class DecoderNode(Node):
    """Pixels [1, 1, S, S] in [-1, 1] (ink = +1) -> uint8 frames [1, out, out, 3], ink dark on white."""

    def __init__(self, output_size: int):
        self.name = "decoder"
        self.max_batch_size = MAX_BATCH_SIZE
        self.output_size = output_size

    @torch.inference_mode()
    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            request.tensors[FRAMES] = self.decode(request.tensors.pop(LATENTS))

    def decode(self, pixels: torch.Tensor) -> torch.Tensor:
        ink = (pixels.float().cpu()[:, 0].clamp(-1, 1) + 1) / 2  # [C=1, S, S] in [0, 1]
        size = (self.output_size, self.output_size)
        big = F.interpolate(ink.unsqueeze(0), size=size, mode="bilinear", align_corners=False)[0]
        paper = ((1 - big.clamp(0, 1)) * 255).round().to(torch.uint8)  # [1, out, out]
        return paper.unsqueeze(-1).expand(-1, -1, -1, 3).contiguous()  # [F=1, out, out, 3]


def load_module(
    module: torch.nn.Module,
    path: Path | None,
    device: torch.device,
    dtype: torch.dtype,
    keep_fp32: tuple[str, ...] = (),
) -> torch.nn.Module:
    """Load safetensors straight to the device (a missing or unexpected tensor is an error);
    path None keeps the module's (seeded) random initialisation (--random-weights). Tensors whose
    names contain a `keep_fp32` pattern stay float32, as the checkpoint loader keeps them."""
    from safetensors.torch import load_file

    module.to(device=device, dtype=dtype)
    state = module.state_dict() if path is None else load_file(str(path), device=str(device))
    typed = {name: t.to(_target_dtype(name, dtype, keep_fp32)) for name, t in state.items()}
    module.load_state_dict(typed, strict=True, assign=True)
    return module.eval().requires_grad_(False)


def _target_dtype(name: str, dtype: torch.dtype, keep_fp32: tuple[str, ...]) -> torch.dtype:
    return torch.float32 if any(pattern in name for pattern in keep_fp32) else dtype


def build_digits_nodes(ctx: BuildContext, weights_dir: Path = WEIGHTS_DIR) -> dict[str, Node]:
    """The nodes of ctx.node_names; weights from ctx.model_path when given, else the shipped ones."""
    from mstar.engine.resources import build_engine_resources

    weights_dir = Path(ctx.model_path) if ctx.model_path else weights_dir
    config = TinyDigitsConfig.load(weights_dir / CONFIG_FILE)
    device = torch.device(ctx.device)
    dtype = default_dtype(device, ctx.config.dtype)  # bf16 on GPU (the big models' kernels), fp32 on CPU

    def weights(file_name: str) -> Path | None:
        return None if ctx.random_weights else weights_dir / file_name

    if ctx.random_weights:
        torch.manual_seed(0)  # the same random model in every worker
    nodes: dict[str, Node] = {}
    if "text_encoder" in ctx.node_names:
        tokenizer = WordTokenizer.load(weights_dir / VOCAB_FILE, config.max_text_tokens)
        encoder = make_text_encoder(len(tokenizer.vocab), config.text_dim)
        load_module(encoder, weights(TEXT_ENCODER_FILE), device, torch.float32)
        nodes["text_encoder"] = TextEncoderNode(encoder, tokenizer, device)
    if "dit" in ctx.node_names:
        resources = build_engine_resources(ctx.config, device, dtype)
        dit = WanDiT(WanDiTConfig.from_dict(config.dit))
        dit = load_module(dit, weights(DIT_FILE), device, dtype, keep_fp32=WanDiT.fp32_param_patterns)
        max_step_cost = ctx.config.max_tokens_per_step
        nodes["dit"] = make_denoise_node(config, dit, resources.attention, device, max_step_cost)
    if "decoder" in ctx.node_names:
        nodes["decoder"] = DecoderNode(config.output_size)
    return nodes


def make_denoise_node(
    config: TinyDigitsConfig, dit: WanDiT, attention, device: torch.device, max_step_cost: int | None = None
) -> DenoiseNode:
    latent_shape = (config.num_channels, 1, config.image_size, config.image_size)  # [C, F, H, W]

    def start(request: RequestState) -> DenoiseStart:
        num_steps = request.params.num_inference_steps
        guidance = request.params.guidance_scale
        sampler = FlowMatchEulerSampler(
            num_steps, shift=config.sampler_shift, sigmas=linear_sigmas(num_steps)
        )
        return DenoiseStart(
            latents=seeded_noise(latent_shape, request.params.seed, device=device),
            sampler=sampler,
            num_tokens=dit.num_tokens(latent_shape),
            guidance_scale=guidance,
            use_guidance=guidance > 1.0,
        )

    def text(request: RequestState, label: str) -> torch.Tensor:
        return request.tensors[PROMPT_EMBEDS if label == COND else NEGATIVE_PROMPT_EMBEDS]

    return DenoiseNode(
        "dit",
        DigitsDenoiser(dit, attention),
        start=start,
        text=text,
        output_tensor=LATENTS,
        max_batch_size=MAX_BATCH_SIZE,
        max_step_cost=max_step_cost,
    )
