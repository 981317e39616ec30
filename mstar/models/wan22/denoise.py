"""Wan2.2's denoise loop: the DiT as a Denoiser plus the request hooks DenoiseNode calls.

Text-to-video follows diffusers' WanPipeline (expand_timesteps, UniPC with flow shift); image-to-video
follows WanImageToVideoPipeline with expand_timesteps: the first latent frame is the encoded image,
it is put back into the model input at every step with timestep 0 (num_clean_frames=1), and into
the final latents.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from mstar.diffusion.denoise import COND, DenoiseItem, DenoiseNode, DenoiseStart, kept_per_label
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import UniPCSampler
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.wan22.config import Wan22Config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.text_encoder import uses_guidance

LATENTS = "latents"
IMAGE_LATENTS = "image_latents"  # normalised VAE latents of the input image [z, 1, h, w]
FIRST_FRAME = "first_frame"
# Condition key: {label: WanDiT.text_kv(text)} [num_layers, 2, L, dim], filled at the request's first
# step and reused by the others (~189 MB per label for the 5B in bf16); dropped when the loop ends.
TEXT_KV = "text_kv"


def latent_shape(config: Wan22Config, width: int, height: int, num_frames: int) -> tuple[int, int, int, int]:
    """[C, F', H', W'] latents for a request's width/height/num_frames."""
    num_latent_frames = (num_frames - 1) // config.vae_scale_temporal + 1
    return (
        config.dit.in_channels,
        num_latent_frames,
        height // config.vae_scale_spatial,
        width // config.vae_scale_spatial,
    )


def pad_text(text: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[n, D] -> [num_tokens, D] with zero rows, as WanPipeline pads prompt embeddings."""
    if text.shape[0] >= num_tokens:
        return text[:num_tokens]
    return torch.cat([text, text.new_zeros(num_tokens - text.shape[0], text.shape[1])])


class WanDenoiser:
    """Every item of a step through one packed DiT forward. The cross-attention keys and values of
    each (request, label) text are computed at its first step and kept in the request's condition."""

    def __init__(self, dit: WanDiT, attention: Any):
        self.dit = dit
        self.attention = attention

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        inputs = []
        for item in items:
            latents, num_clean = item.latents, 0
            first_frame = item.condition.get(FIRST_FRAME)
            if first_frame is not None:
                num_clean = first_frame.shape[1]
                latents = torch.cat([first_frame, latents[:, num_clean:]], dim=1)
            inputs.append(
                DiTInput(
                    latents,
                    item.timestep,
                    num_clean_frames=num_clean,
                    text_kv=kept_per_label(item, TEXT_KV, partial(self.dit.text_kv, item.text)),
                )
            )
        return self.dit(inputs, self.attention)


class WanHooks:
    """start / text / finish for DenoiseNode, from request params and tensors."""

    def __init__(self, config: Wan22Config, device: str | torch.device, dtype: torch.dtype):
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype

    def start(self, request: RequestState) -> DenoiseStart:
        params = request.params
        shape = latent_shape(self.config, params.width, params.height, params.num_frames)
        condition = {}
        if IMAGE_LATENTS in request.tensors:
            condition[FIRST_FRAME] = request.tensors[IMAGE_LATENTS].to(self.device, torch.float32)
        p_t, p_h, p_w = self.config.dit.patch_size
        return DenoiseStart(
            latents=seeded_noise(shape, params.seed, device=self.device),
            sampler=UniPCSampler(params.num_inference_steps, shift=self.config.flow_shift),
            num_tokens=(shape[1] // p_t) * (shape[2] // p_h) * (shape[3] // p_w),
            guidance_scale=float(params.guidance_scale),
            use_guidance=uses_guidance(params),
            condition=condition,
        )

    def text(self, request: RequestState, label: str) -> torch.Tensor:
        key = PROMPT_EMBEDS if label == COND else NEGATIVE_PROMPT_EMBEDS
        embeds = request.tensors[key].to(self.device, self.dtype)
        return pad_text(embeds, self.config.max_text_tokens)


class WanDenoiseNode(DenoiseNode):
    """DenoiseNode over the Wan DiT, with warmup of the configured sizes and recompile counting."""

    def __init__(self, denoiser: WanDenoiser, hooks: WanHooks, warmup_shapes=(), name: str = "dit", **kwargs):
        super().__init__(
            name,
            denoiser,
            start=hooks.start,
            text=hooks.text,
            finish=self._store_latents,
            output_tensor=LATENTS,
            **kwargs,
        )
        self.hooks = hooks
        self.warmup_shapes = list(warmup_shapes)  # latent [C, F', H', W'] shapes

    def _store_latents(self, request: RequestState, latents: torch.Tensor) -> None:
        condition = request.state[self.name].condition
        # The loop is over: free the text keys/values now, not when the whole request ends (decode
        # runs in between). On abort or failure release() drops the state, condition included.
        condition.pop(TEXT_KV, None)
        first_frame = condition.get(FIRST_FRAME)
        if first_frame is not None:
            latents = torch.cat([first_frame, latents[:, first_frame.shape[1] :]], dim=1)
        request.tensors[LATENTS] = latents

    def warmup(self) -> None:
        config = self.hooks.config
        text = torch.zeros(config.max_text_tokens, config.dit.text_dim, device=self.hooks.device)
        for shape in self.warmup_shapes:
            latents = torch.zeros(shape, device=self.hooks.device)
            item = DenoiseItem("warmup", COND, latents, 999.0, 1.0, 0, text, {})
            self.denoiser.predict([item])
            self.denoiser.predict([item, item])  # a pair reuses the graph (compile_layers)
        self.denoiser.dit.finish_warmup()

    def num_recompiles(self) -> int:
        return self.denoiser.dit.num_recompiles
