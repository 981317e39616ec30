"""Z-Image's hooks into the shared DenoiseNode: initial latents and sampler per request, the
packed DiT call, and the pipeline's guidance rule.

As ZImagePipeline: latents are float32 CPU-seeded noise [16, 2*(H//16), 2*(W//16)]; sigmas are
linspace(1, 1/N, N) shifted by the scheduler's static shift; the DiT sees (1000 - t) / 1000 and
predicts the negated velocity; guidance runs whenever guidance_scale > 0 as
pos + scale * (pos - neg).
"""

from __future__ import annotations

from functools import partial

import torch

from mstar.diffusion.denoise import COND, DenoiseItem, DenoiseNode, DenoiseStart, kept_per_label
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, linear_sigmas
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.zimage.config import SchedulerConfig, ZImageConfig
from mstar.models.zimage.dit import DiTInput, ZImageDiT, padded_len
from mstar.models.zimage.text_encoder import uses_guidance

LATENTS = "latents"
REFINED_CAPTIONS = "refined_captions"  # DenoiseStart.condition key: label -> [padded L, dim]


def model_timestep(timestep: float) -> float:
    """Scheduler timestep (0..1000) -> the DiT's input, (1000 - t) / 1000 in float32 as the pipeline."""
    t = torch.tensor(timestep, dtype=torch.float32)
    return float((1000 - t) / 1000)


def zimage_guidance(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """The pipeline's rule: pos + scale * (pos - neg) (no truncation/renormalisation by default)."""
    return cond + scale * (cond - uncond)


def latent_size(height: int, width: int, vae_scale: int) -> tuple[int, int]:
    return 2 * (height // (vae_scale * 2)), 2 * (width // (vae_scale * 2))


def image_shift_mu(scheduler: SchedulerConfig, image_seq_len: int) -> float:
    """The pipeline's resolution-dependent mu (used only by dynamically shifting schedulers)."""
    slope = (scheduler.max_shift - scheduler.base_shift) / (
        scheduler.max_image_seq_len - scheduler.base_image_seq_len
    )
    intercept = scheduler.base_shift - slope * scheduler.base_image_seq_len
    return image_seq_len * slope + intercept


def make_sampler(
    scheduler: SchedulerConfig, num_steps: int, height: int, width: int
) -> FlowMatchEulerSampler:
    """The schedule ZImagePipeline sets: linspace(1, 1/N, N) sigmas, shifted (latent size h x w)."""
    mu = image_shift_mu(scheduler, (height // 2) * (width // 2)) if scheduler.use_dynamic_shifting else None
    return FlowMatchEulerSampler(
        num_steps, shift=scheduler.shift, sigmas=linear_sigmas(num_steps), mu=mu,
        num_train_timesteps=scheduler.num_train_timesteps,
    )  # fmt: skip


class ZImageDenoiser:
    """Runs the DiT once over every (request, label) item of the step."""

    def __init__(self, dit: ZImageDiT, attn, device: torch.device | str):
        self.dit = dit
        self.attn = attn
        self.device = torch.device(device)

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        inputs = []
        for item in items:
            caption = item.text.to(self.device)
            inputs.append(
                DiTInput(
                    item.latents.to(self.device),
                    model_timestep(item.timestep),
                    caption,
                    refined_caption=kept_per_label(
                        item, REFINED_CAPTIONS, partial(self.dit.refine_caption, caption, self.attn)
                    ),
                )
            )
        return [-out.float() for out in self.dit(inputs, self.attn)]  # the scheduler wants -velocity


class ZImageHooks:
    """`start` and `text` hooks for DenoiseNode, bound to the model's configs and device."""

    def __init__(self, config: ZImageConfig, device: torch.device | str):
        self.config = config
        self.device = torch.device(device)

    def start(self, request: RequestState) -> DenoiseStart:
        params = request.params
        height, width = latent_size(params.height, params.width, self.config.vae.spatial_scale)
        sampler = make_sampler(self.config.scheduler, params.num_inference_steps, height, width)
        latents = seeded_noise((self.config.dit.in_channels, height, width), params.seed, device=self.device)
        patch = self.config.dit.patch_size
        num_image = padded_len((height // patch) * (width // patch))
        use_guidance = uses_guidance(params)
        # Each label is image + its own caption; the longer caption bounds both, so the step cost
        # (num_tokens x labels) never undercounts a long negative prompt against max_tokens_per_step.
        captions = [PROMPT_EMBEDS, NEGATIVE_PROMPT_EMBEDS] if use_guidance else [PROMPT_EMBEDS]
        num_tokens = num_image + max(padded_len(request.tensors[key].shape[0]) for key in captions)
        return DenoiseStart(
            latents=latents,
            sampler=sampler,
            num_tokens=num_tokens,
            guidance_scale=params.guidance_scale,
            use_guidance=use_guidance,
        )

    def text(self, request: RequestState, label: str) -> torch.Tensor:
        return request.tensors[PROMPT_EMBEDS if label == COND else NEGATIVE_PROMPT_EMBEDS]


class ZImageDenoiseNode(DenoiseNode):
    """DenoiseNode with Z-Image's warmup: one step per configured size, then recompiles count."""

    def __init__(self, name: str, denoiser: ZImageDenoiser, hooks: ZImageHooks, warmup_sizes, **kwargs):
        super().__init__(
            name, denoiser, start=hooks.start, text=hooks.text, output_tensor=LATENTS,
            combine_guidance=zimage_guidance, **kwargs,
        )  # fmt: skip
        self.hooks = hooks
        self.warmup_sizes = list(warmup_sizes)  # (width, height) pairs

    def warmup(self) -> None:
        config = self.hooks.config
        caption = torch.zeros(64, config.dit.cap_feat_dim, device=self.hooks.device)
        for width, height in self.warmup_sizes:
            h, w = latent_size(height, width, config.vae.spatial_scale)
            latents = torch.zeros(config.dit.in_channels, h, w, device=self.hooks.device)
            item = DenoiseItem("warmup", COND, latents, 500.0, 0.5, 0, caption, {})
            # one item, then a pair that reuses its graph (ZImageDiT.compile_layers)
            self.denoiser.predict([item])
            self.denoiser.predict([item, item])
        self.denoiser.dit.finish_warmup()

    def num_recompiles(self) -> int:
        return self.denoiser.dit.num_recompiles
