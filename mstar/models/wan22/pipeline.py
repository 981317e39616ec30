"""Wan2.2-TI2V-5B's pipeline, readable top to bottom in diffusers' order: encode the prompts, encode
the input image (image-to-video), prepare the latents, predict over the packed batch, guide, step,
finish, decode. The shared nodes drive it (mstar.models.text_encoding, mstar.diffusion.denoise,
mstar.diffusion.vae_nodes); each worker builds it with the components it holds.

Text-to-video follows diffusers' WanPipeline (expand_timesteps, UniPC with flow shift);
image-to-video follows WanImageToVideoPipeline with expand_timesteps: the first latent frame is the
encoded image, put back into the model input at every step with timestep 0 (num_clean_frames=1)
and into the final latents.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from mstar.diffusion.denoise import (
    COND,
    UNCOND,
    DenoiseItem,
    DenoiseStart,
    DenoiseState,
    cfg_combine,
    kept_per_label,
)
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import UniPCSampler
from mstar.diffusion.scheduler_config import UniPCConfig
from mstar.diffusion.vae_nodes import INPUT_REFERENCE, LATENTS
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.wan22.config import Wan22Config
from mstar.models.wan22.dit import DiTInput
from mstar.models.wan22.geometry import WanGeometry
from mstar.models.wan22.model import WanParams
from mstar.models.wan22.vae import denormalize_latents, normalize_latents

IMAGE_LATENTS = "image_latents"  # normalised VAE latents of the input image [z, 1, h, w]
FIRST_FRAME = "first_frame"  # condition key: the image's latents, float32 on the DiT's device
# Condition key: {label: WanDiT.text_kv(text)} [num_layers, 2, L, dim], filled at the request's first
# step and reused by the others (~189 MB per label for the 5B in bf16); the node drops it at the last.
TEXT_KV = "text_kv"
TEXT_OF_LABEL = {COND: PROMPT_EMBEDS, UNCOND: NEGATIVE_PROMPT_EMBEDS}


def unipc_sampler(scheduler: UniPCConfig, num_steps: int) -> UniPCSampler:
    """The sampler the folder's scheduler config describes (WanPipeline's UniPC, flow sigmas)."""
    return UniPCSampler.from_config(scheduler, num_steps)


def pad_text(text: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[n, D] -> [num_tokens, D] with zero rows, as WanPipeline pads prompt embeddings."""
    if text.shape[0] >= num_tokens:
        return text[:num_tokens]
    return torch.cat([text, text.new_zeros(num_tokens - text.shape[0], text.shape[1])])


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


class WanPipeline:
    """Components (each None where this worker does not hold it): `text_encoder`
    (UMT5PromptEncoder), `dit` (WanDiT) with its `attention` resource, `vae_encoder`
    (WanVAEEncoder), `decoder` (mstar.diffusion.vae_decode.VaeDecodeRunner over WanVAEDecoder)."""

    def __init__(
        self, config: Wan22Config, device: str | torch.device, dtype: torch.dtype,
        text_encoder=None, dit=None, attention=None, vae_encoder=None, decoder=None,
    ):  # fmt: skip
        self.config = config
        self.geometry = WanGeometry.of(config)
        self.device = torch.device(device)
        self.dtype = dtype
        self.text_encoder, self.dit, self.attention = text_encoder, dit, attention
        self.vae_encoder, self.decoder = vae_encoder, decoder
        self.lora = None  # mstar.engine.lora.serving.LoraServing when the server has adapters

    # ---- 1. prompts (text_encoder node) -----------------------------------------------------

    def prompts(self, params: WanParams) -> dict[str, str]:
        """The texts a request needs: its prompt, and its negative prompt under guidance."""
        labels = self.geometry.labels(params.guidance_scale)
        texts = {COND: params.prompt, UNCOND: params.negative_prompt}
        return {TEXT_OF_LABEL[label]: texts[label] for label in labels}

    def encode_prompt(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [num_tokens, d_model] embedding per prompt, each encoded alone."""
        return self.text_encoder.encode(prompts)

    def warmup_text_encoder(self) -> None:
        self.text_encoder.warmup()  # CUDA graphs per length bucket, when they are on

    # ---- 2. the input image (vae_encoder node, image-to-video) ------------------------------

    def encode_image(self, request: RequestState) -> None:
        """input_reference uint8 [H, W, 3] -> request.tensors["image_latents"] [z, 1, h, w] float32."""
        if INPUT_REFERENCE not in request.tensors:
            raise ValueError(
                f"request {request.request_id}: image-to-video needs an '{INPUT_REFERENCE}' image"
            )
        params = request.params
        weight = next(self.vae_encoder.parameters())
        video = image_to_video_input(request.tensors.pop(INPUT_REFERENCE), params.width, params.height)
        latents = self.vae_encoder.encode(video.to(weight.device, weight.dtype)).float()
        request.tensors[IMAGE_LATENTS] = normalize_latents(latents, self.vae_encoder.config)[0]

    # ---- 3. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params = request.params
        shape = self.geometry.latent_shape(params.width, params.height, params.num_frames)
        condition = {}
        if IMAGE_LATENTS in request.tensors:
            condition[FIRST_FRAME] = request.tensors[IMAGE_LATENTS].to(self.device, torch.float32)
        texts = {
            label: pad_text(
                request.tensors[TEXT_OF_LABEL[label]].to(self.device, self.dtype), self.config.max_text_tokens
            )
            for label in self.geometry.labels(params.guidance_scale)
        }
        return DenoiseStart(
            latents=seeded_noise(shape, params.seed, device=self.device).to(torch.float32),
            sampler=unipc_sampler(self.config.scheduler, params.num_inference_steps),
            num_tokens=self.geometry.latent_tokens(shape),
            texts=texts,
            guidance_scale=float(params.guidance_scale),
            condition=condition,
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        """Every item of the step through one packed DiT forward. The cross-attention keys and
        values of each (request, label) text are computed at its first step and kept (with the
        request's adapters: the text rows apply them too)."""
        inputs = []
        for item in items:
            latents, num_clean = item.latents, 0
            first_frame = item.condition.get(FIRST_FRAME)
            if first_frame is not None:
                num_clean = first_frame.shape[1]
                latents = torch.cat([first_frame, latents[:, num_clean:]], dim=1)
            text_kv = kept_per_label(item, TEXT_KV, partial(self._text_kv, item))
            inputs.append(DiTInput(latents, item.timestep, num_clean_frames=num_clean, text_kv=text_kv))
        if self.lora is not None:  # next to the attention plan: one segment per item's tokens
            lengths = [self.dit.num_tokens(tuple(item.latents.shape)) for item in items]
            self.lora.set_step("tokens", lengths, [item.request_id for item in items])
        return self.dit(inputs, self.attention)

    def _text_kv(self, item: DenoiseItem) -> torch.Tensor:
        if self.lora is None:
            return self.dit.text_kv(item.text)
        with self.lora.only(item.request_id, "text"):
            return self.dit.text_kv(item.text)

    def guide(self, outputs: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
        """WanPipeline's classifier-free guidance, in the DiT's output dtype (bf16 for a bf16 DiT):
        the pipeline guides and hands the scheduler that tensor, and its rounding is part of what
        it computes; the sampler promotes it as diffusers' does."""
        guided = outputs[COND]
        if UNCOND in outputs:
            guided = cfg_combine(guided, outputs[UNCOND], guidance_scale)
        return guided

    def step(self, state: DenoiseState, guided: torch.Tensor) -> torch.Tensor:
        return state.sampler.step(guided, state.latents)

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        """The final latents (the first frame put back) go to request.tensors["latents"]. The text
        keys and values leave with this step too: the node frees what the request kept (decode
        runs before the request ends)."""
        state.texts = dict.fromkeys(state.texts)
        latents = state.latents
        first_frame = state.condition.get(FIRST_FRAME)
        if first_frame is not None:
            latents = torch.cat([first_frame, latents[:, first_frame.shape[1] :]], dim=1)
        request.tensors[LATENTS] = latents

    def warmup_item(self, size) -> DenoiseItem:
        """A zero item of a config compile size (None: the default size) for the boot warmup."""
        shape = self.geometry.latent_shape(*self._clip_size(size))
        text = torch.zeros(self.config.max_text_tokens, self.config.dit.text_dim, device=self.device)
        return DenoiseItem("warmup", COND, torch.zeros(shape, device=self.device), 999.0, 1.0, 0, text, {})

    # ---- 4. decode (vae_decoder node) -------------------------------------------------------

    def _vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        latents = latents.to(self.decoder.device, torch.float32)[None]
        return denormalize_latents(latents, self.decoder.decoder.config).to(self.decoder.dtype)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents [C, F', H', W'] -> uint8 frames [F, H, W, 3] on the device."""
        return self.decoder.decode_uint8(self._vae_latents(latents))

    def decode_pieces(self, latents: torch.Tensor):
        """The same frames in pieces on the host, each as soon as its chunk is decoded."""
        yield from self.decoder.iter_host_uint8(self._vae_latents(latents))

    def warmup_decode(self, size, index: int) -> None:
        """Compile one size's clip decode and check it against the plain decode, inline, on seeded
        random latents (zeros decode to near-flat frames and would hide a miscompile)."""
        shape = self.geometry.latent_shape(*self._clip_size(size))
        latents = seeded_noise((1, *shape), seed=index).to(self.decoder.device, self.decoder.dtype)
        self.decoder.warm_decode(latents)

    def _clip_size(self, size) -> tuple[int, int, int]:
        c = self.config
        if size is None:
            return c.default_width, c.default_height, c.default_num_frames
        return size.width, size.height, size.num_frames or c.default_num_frames
