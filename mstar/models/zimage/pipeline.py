"""Z-Image-Turbo's pipeline, readable top to bottom in diffusers' order: encode the prompts, prepare
the latents, predict over the packed batch, guide, step, finish, decode. The shared nodes drive it
(mstar.models.text_encoding, mstar.diffusion.denoise, mstar.diffusion.vae_nodes); each worker
builds it with the components it holds.

As ZImagePipeline: latents are float32 CPU-seeded noise [16, 2*(H//16), 2*(W//16)]; sigmas are
linspace(1, 1/N, N) shifted by the scheduler's static shift; the DiT sees (1000 - t) / 1000 and
predicts the negated velocity; guidance runs whenever guidance_scale > 0 as
pos + scale * (pos - neg).
"""

from __future__ import annotations

from functools import partial

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, DenoiseStart, DenoiseState, kept_per_label
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, linear_sigmas
from mstar.diffusion.vae_nodes import LATENTS
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.zimage.config import SchedulerConfig, ZImageConfig
from mstar.models.zimage.dit import DiTInput
from mstar.models.zimage.geometry import ZImageGeometry
from mstar.models.zimage.lora import CAPTION, set_step_rows
from mstar.models.zimage.model import ZImageParams

REFINED_CAPTIONS = "refined_captions"  # condition key: label -> [padded L, dim], from the first step
TEXT_OF_LABEL = {COND: PROMPT_EMBEDS, UNCOND: NEGATIVE_PROMPT_EMBEDS}
DEFAULT_WARMUP_SIZE = (1024, 1024)
WARMUP_CAPTION_TOKENS = 64


def model_timestep(timestep: float) -> float:
    """Scheduler timestep (0..1000) -> the DiT's input, (1000 - t) / 1000 in float32 as the pipeline."""
    t = torch.tensor(timestep, dtype=torch.float32)
    return float((1000 - t) / 1000)


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


class ZImagePipeline:
    """Components (each None where this worker does not hold it): `text_encoder`
    (Qwen3PromptEncoder), `dit` (ZImageDiT) with its `attention` resource, `vae` (VAEDecoder) and
    `decoder`: its decode as served (an mstar.engine.checked_compile.CheckedFunction when compiled,
    None when eager)."""

    def __init__(
        self, config: ZImageConfig, device: str | torch.device,
        text_encoder=None, dit=None, attention=None, vae=None, decoder=None,
    ):  # fmt: skip
        self.config = config
        self.geometry = ZImageGeometry.of(config)
        self.device = torch.device(device)
        self.text_encoder, self.dit, self.attention = text_encoder, dit, attention
        self.vae, self.decoder = vae, decoder
        self.lora = None  # mstar.engine.lora.serving.LoraServing when the server has adapters

    # ---- 1. prompts (text_encoder node) -----------------------------------------------------

    def prompts(self, params: ZImageParams) -> dict[str, str]:
        """The texts a request needs: its prompt, and its negative prompt under guidance."""
        texts = {COND: params.prompt, UNCOND: params.negative_prompt}
        return {TEXT_OF_LABEL[label]: texts[label] for label in self.geometry.labels(params.guidance_scale)}

    def encode_prompt(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [num_tokens, hidden] embedding per prompt (Qwen3's second-to-last hidden states)."""
        return self.text_encoder.encode(prompts)

    def warmup_text_encoder(self) -> None:
        self.text_encoder.warmup()  # CUDA graphs per length bucket, when they are on

    # ---- 2. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params = request.params
        height, width = self.geometry.latent_size(params.width, params.height)
        labels = self.geometry.labels(params.guidance_scale)
        texts = {label: request.tensors[TEXT_OF_LABEL[label]] for label in labels}
        latents = seeded_noise((self.config.dit.in_channels, height, width), params.seed, device=self.device)
        return DenoiseStart(
            latents=latents.to(torch.float32),
            sampler=make_sampler(self.config.scheduler, params.num_inference_steps, height, width),
            num_tokens=self.geometry.num_tokens(
                params.width, params.height, [t.shape[0] for t in texts.values()]
            ),
            texts=texts,
            guidance_scale=params.guidance_scale,
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        """Every item of the step through one packed DiT forward. A caption's context-refiner
        output is computed at its request's first step and kept (with the request's adapters:
        the caption rows apply them too)."""
        inputs = []
        for item in items:
            caption = item.text.to(self.device)
            refined = kept_per_label(item, REFINED_CAPTIONS, partial(self._refine, item, caption))
            timestep = model_timestep(item.timestep)
            inputs.append(DiTInput(item.latents.to(self.device), timestep, caption, refined_caption=refined))
        if self.lora is not None:  # next to the attention plans: one segment per item in each layout
            geometries = [self.dit.geometry(dit_input) for dit_input in inputs]
            set_step_rows(self.lora, geometries, [item.request_id for item in items])
        return [-out.float() for out in self.dit(inputs, self.attention)]  # the scheduler wants -velocity

    def _refine(self, item: DenoiseItem, caption: torch.Tensor) -> torch.Tensor:
        if self.lora is None:
            return self.dit.refine_caption(caption, self.attention)
        with self.lora.only(item.request_id, CAPTION):
            return self.dit.refine_caption(caption, self.attention)

    def guide(self, outputs: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
        """The pipeline's rule: pos + scale * (pos - neg) (no truncation or renormalisation)."""
        guided = outputs[COND]  # float32 already (predict returns it so)
        if UNCOND in outputs:
            guided = guided + guidance_scale * (guided - outputs[UNCOND])
        return guided

    def step(self, state: DenoiseState, guided: torch.Tensor) -> torch.Tensor:
        return state.sampler.step(guided, state.latents)

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        request.tensors[LATENTS] = state.latents

    def warmup_item(self, size) -> DenoiseItem:
        """A zero item of a config compile size (None: 1024x1024) for the boot warmup."""
        h, w = self.geometry.latent_size(*self._image_size(size))
        latents = torch.zeros(self.config.dit.in_channels, h, w, device=self.device)
        caption = torch.zeros(WARMUP_CAPTION_TOKENS, self.config.dit.cap_feat_dim, device=self.device)
        return DenoiseItem("warmup", COND, latents, 500.0, 0.5, 0, caption, {})

    # ---- 3. decode (vae_decoder node) -------------------------------------------------------

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents [C, h, w] -> uint8 [1, H, W, 3] on the device. float32 as at warmup, so a
        compiled graph's dtype guard holds."""
        latents = latents.to(self.device, torch.float32)
        return self.vae.decode_frames(latents) if self.decoder is None else self.decoder(latents)

    def warmup_decode(self, size, index: int) -> None:
        """Compile and check one size's decode on seeded random latents (zeros decode to near-flat
        frames that would hide a miscompile)."""
        h, w = self.geometry.latent_size(*self._image_size(size))
        latents = seeded_noise((self.config.vae.latent_channels, h, w), seed=index, device=self.device)
        if self.decoder is None:
            self.decode(latents)
        else:
            self.decoder.warm(latents)  # inline: a configured size never waits for the compile thread

    @staticmethod
    def _image_size(size) -> tuple[int, int]:
        return DEFAULT_WARMUP_SIZE if size is None else (size.width, size.height)
