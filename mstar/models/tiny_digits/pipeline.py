"""tiny-digits' pipeline, readable top to bottom in diffusers' order: encode the prompts, prepare
the latents, predict over the packed batch, guide, step, finish, decode. The Wan DiT at a toy size
denoises 16x16 grayscale pixels (no VAE) with flow-match Euler steps; decode upscales the pixels to
the served size, dark ink on white. The shared nodes drive it (mstar.models.text_encoding,
mstar.diffusion.denoise, mstar.diffusion.vae_nodes).

Request tensors: prompt_embeds / negative_prompt_embeds float32 [L, text_dim] (text_encoder),
latents float32 [1, 1, 16, 16] pixels in [-1, 1] (dit), frames uint8 [1, 256, 256, 3] (decoder).
"""

from __future__ import annotations

from dataclasses import asdict

import torch
import torch.nn.functional as F

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, DenoiseStart, DenoiseState, cfg_combine
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, linear_sigmas
from mstar.diffusion.vae_nodes import LATENTS
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.tiny_digits.config import TinyDigitsConfig
from mstar.models.tiny_digits.geometry import DigitsGeometry
from mstar.models.tiny_digits.model import DigitsParams
from mstar.models.wan22.dit import DiTInput

TEXT_OF_LABEL = {COND: PROMPT_EMBEDS, UNCOND: NEGATIVE_PROMPT_EMBEDS}


class DigitsPipeline:
    """Components (each None where this worker does not hold it): `text_encoder` with its
    `tokenizer` (mstar.models.tiny_digits.text), `dit` (WanDiT) with its `attention` resource."""

    decoder = None  # decoding is an upscale: nothing to compile or warm up

    def __init__(
        self, config: TinyDigitsConfig, device: str | torch.device,
        text_encoder=None, tokenizer=None, dit=None, attention=None,
    ):  # fmt: skip
        self.config = config
        self.geometry = DigitsGeometry.of(asdict(config))
        self.device = torch.device(device)
        self.text_encoder, self.tokenizer = text_encoder, tokenizer
        self.dit, self.attention = dit, attention

    # ---- 1. prompts (text_encoder node) -----------------------------------------------------

    def prompts(self, params: DigitsParams) -> dict[str, str]:
        """Both texts, always (a few words each: encoding the negative costs nothing)."""
        return {PROMPT_EMBEDS: params.prompt, NEGATIVE_PROMPT_EMBEDS: params.negative_prompt}

    @torch.inference_mode()
    def encode_prompt(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [L, text_dim] embedding per prompt, each encoded alone."""
        embeds = []
        for prompt in prompts:
            ids = torch.tensor([self.tokenizer.encode(prompt)], device=self.device)  # [1, L]
            padding_mask = torch.zeros_like(ids, dtype=torch.bool)
            embeds.append(self.text_encoder(ids, padding_mask)[0].float())
        return embeds

    # ---- 2. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params = request.params
        num_steps = params.num_inference_steps
        sampler = FlowMatchEulerSampler(
            num_steps, shift=self.config.sampler_shift, sigmas=linear_sigmas(num_steps)
        )
        labels = self.geometry.labels(params.guidance_scale)
        latents = seeded_noise(self.geometry.latent_shape, params.seed, device=self.device)
        return DenoiseStart(
            latents=latents.to(torch.float32),
            sampler=sampler,
            num_tokens=self.geometry.num_tokens,
            texts={label: request.tensors[TEXT_OF_LABEL[label]] for label in labels},
            guidance_scale=params.guidance_scale,
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        inputs = [DiTInput(item.latents, item.timestep, item.text) for item in items]
        return [velocity.float() for velocity in self.dit(inputs, self.attention)]

    def guide(self, outputs: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
        guided = outputs[COND]  # float32 already (predict returns it so)
        if UNCOND in outputs:
            guided = cfg_combine(guided, outputs[UNCOND], guidance_scale)
        return guided

    def step(self, state: DenoiseState, guided: torch.Tensor) -> torch.Tensor:
        return state.sampler.step(guided, state.latents)

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        request.tensors[LATENTS] = state.latents

    def warmup_item(self, size) -> DenoiseItem:
        text = torch.zeros(1, self.config.text_dim, device=self.device)
        latents = torch.zeros(self.geometry.latent_shape, device=self.device)
        return DenoiseItem("warmup", COND, latents, 999.0, 1.0, 0, text, {})

    # ---- 3. decode (decoder node) -----------------------------------------------------------

    def decode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [1, 1, S, S] in [-1, 1] (ink = +1) -> uint8 frames [1, out, out, 3], ink dark on white."""
        ink = (pixels.float().cpu()[:, 0].clamp(-1, 1) + 1) / 2  # [C=1, S, S] in [0, 1]
        size = (self.config.output_size, self.config.output_size)
        big = F.interpolate(ink.unsqueeze(0), size=size, mode="bilinear", align_corners=False)[0]
        paper = ((1 - big.clamp(0, 1)) * 255).round().to(torch.uint8)  # [1, out, out]
        return paper.unsqueeze(-1).expand(-1, -1, -1, 3).contiguous()  # [F=1, out, out, 3]

    def warmup_decode(self, size, index: int) -> None:
        """Nothing to compile."""
