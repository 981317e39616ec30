"""FLUX.2 [klein]'s pipeline, readable top to bottom in Flux2KleinPipeline's order: encode the
prompts, encode the reference images, prepare the latents, predict over the packed batch, guide,
step, finish, decode. The shared nodes drive it (mstar.models.text_encoding,
mstar.diffusion.vae_nodes, mstar.diffusion.denoise); each worker builds it with the components it
holds.

As the pipeline: the prompt is Qwen3's layers 9/18/27 over 512 padded tokens, the negative one ""
(only under classifier-free guidance: guidance_scale > 1 on an undistilled checkpoint); latents
are CPU-seeded noise [128, H/16, W/16] (the patchified, batch-normalised grid) drawn in the
prompt embeddings' dtype and held in float32; reference images are scaled to at most 1024^2
pixels, cropped to multiples of 16 and VAE-encoded (the mode);
sigmas linspace(1, 1/N, N) time-shifted by the empirical mu of the output's tokens and N; the DiT
predicts the velocity and guidance is neg + scale * (pos - neg).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, DenoiseStart, DenoiseState
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.vae_nodes import LATENTS
from mstar.graph import RequestState, reference_image_input
from mstar.models.flux2_klein.config import Flux2KleinConfig
from mstar.models.flux2_klein.dit import DiTInput
from mstar.models.flux2_klein.geometry import Flux2KleinGeometry, reference_pixel_size, warmup_reference_size
from mstar.models.flux2_klein.lora import set_step_rows
from mstar.models.flux2_klein.model import WARMUP_NUM_REFERENCES, Flux2KleinParams
from mstar.models.flux2_klein.references import prepare_reference
from mstar.models.flux2_klein.schedule import make_sampler
from mstar.models.flux2_klein.vae_compile import seeded_pixels
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS

TEXT_OF_LABEL = {COND: PROMPT_EMBEDS, UNCOND: NEGATIVE_PROMPT_EMBEDS}
REFERENCES = "references"  # condition key: the reference latents, [128, h_j, w_j] each, on the device
DEFAULT_WARMUP_SIZE = (1024, 1024)


def reference_latents_key(index: int) -> str:
    """request.tensors key of reference image `index`'s latents (the vae_encoder node's output)."""
    return f"reference_latents_{index}"


def as_uint8_image(value) -> np.ndarray:
    """An input image (numpy, or a torch tensor after transport) as uint8 [H, W, 3] on the host."""
    if isinstance(value, torch.Tensor):
        value = value.cpu().numpy()
    return np.ascontiguousarray(value, dtype=np.uint8)


class Flux2KleinPipeline:
    """Components (each None where this worker does not hold it): `text_encoder` (PromptEncoder),
    `vae_encoder` (VAEEncoder) and `encoder`: its encode as served, `dit` (Flux2DiT) with its
    `attention` resource, `vae` (VAEDecoder) and `decoder`: its decode as served (`encoder` and
    `decoder` are CheckedFunctions when compiled, None eager; vae_compile.py)."""

    def __init__(
        self, config: Flux2KleinConfig, device: str | torch.device, text_encoder=None, vae_encoder=None,
        dit=None, attention=None, vae=None, decoder=None, encoder=None,
    ):  # fmt: skip
        self.config = config
        self.geometry = Flux2KleinGeometry.of(config)
        self.device = torch.device(device)
        self.text_encoder, self.vae_encoder, self.encoder = text_encoder, vae_encoder, encoder
        self.dit, self.attention = dit, attention
        self.vae, self.decoder = vae, decoder
        self.lora = None  # mstar.engine.lora.serving.LoraServing when the server has adapters

    # ---- 1. prompts (text_encoder node) -----------------------------------------------------

    def prompts(self, params: Flux2KleinParams) -> dict[str, str]:
        """The texts a request needs: its prompt, and its negative prompt ("" by default) under guidance."""
        texts = {COND: params.prompt, UNCOND: params.negative_prompt}
        return {TEXT_OF_LABEL[label]: texts[label] for label in self.geometry.labels(params.guidance_scale)}

    def encode_prompt(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [512, 3 x hidden] embedding per prompt, each in a forward of its own."""
        return self.text_encoder.encode(prompts)

    def warmup_text_encoder(self) -> None:
        self.encode_prompt(["warmup"])

    # ---- 2. reference images (vae_encoder node, edits) --------------------------------------

    @torch.inference_mode()
    def encode_image(self, request: RequestState) -> None:
        """Each reference uint8 [H, W, 3] -> request.tensors[reference_latents_key(i)] [128, h, w]
        float32 (encoded one at a time: each has its own size)."""
        weight = next(self.vae_encoder.parameters())
        for index in range(len(request.params.reference_sizes)):
            key = reference_image_input(index)
            if key not in request.tensors:
                raise ValueError(f"request {request.request_id}: the edit lacks its image '{key}'")
            image = as_uint8_image(request.tensors.pop(key))
            pixels = prepare_reference(image, self.geometry.vae_scale)  # [3, h, w] in [-1, 1]
            latents = self._encode(pixels[None].to(weight.device, weight.dtype))
            request.tensors[reference_latents_key(index)] = latents[0].float()

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vae_encoder.encode(pixels) if self.encoder is None else self.encoder(pixels)

    def warmup_encode(self, size, index: int) -> None:
        """Compile and check the encode of a reference at a config compile size (None: 1024x1024)
        inline, on seeded pixels: as large as the output, encoded at its capped, cropped size."""
        uploaded = warmup_reference_size(*self._image_size(size))
        if uploaded is None:
            return
        width, height = reference_pixel_size(*uploaded, vae_scale=self.geometry.vae_scale)
        weight = next(self.vae_encoder.parameters())
        pixels = seeded_pixels((1, 3, height, width), index, weight.device, weight.dtype)
        if self.encoder is None:
            self._encode(pixels)
        else:
            self.encoder.warm(pixels)  # inline: a configured size never waits for the compile thread

    # ---- 3. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params = request.params
        rows, cols = self.geometry.latent_grid(params.width, params.height)
        labels = self.geometry.labels(params.guidance_scale)
        texts = {label: request.tensors[TEXT_OF_LABEL[label]] for label in labels}
        references = [
            request.tensors.pop(reference_latents_key(index)).to(self.device, torch.float32)
            for index in range(len(params.reference_sizes))
        ]
        # drawn in the prompt embeddings' dtype (bf16 on a GPU), as the pipeline draws it: a CPU
        # generator's bf16 normals are not its float32 ones rounded in every torch release
        latents = seeded_noise(
            (self.config.transformer.in_channels, rows, cols), params.seed, texts[COND].dtype, self.device
        )
        tokens = self.geometry.tokens(params.width, params.height, params.reference_sizes)
        return DenoiseStart(
            latents=latents.to(torch.float32),
            sampler=make_sampler(self.config.scheduler, params.num_inference_steps, rows * cols),
            num_tokens=tokens.num_tokens,
            texts=texts,
            guidance_scale=params.guidance_scale,
            condition={REFERENCES: references},
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[torch.Tensor]:
        """Every item of the step (each request's labels, any sizes and reference counts) through
        one packed DiT forward; float32 velocities [128, h, w]."""
        inputs = [
            DiTInput(
                item.latents.to(self.device),
                item.timestep,
                item.text.to(self.device),
                item.condition.get(REFERENCES, ()),
            )  # fmt: skip
            for item in items
        ]
        if self.lora is not None:  # next to the attention plan: one segment per item in each stream
            set_step_rows(
                self.lora, [dit_input.tokens() for dit_input in inputs], [i.request_id for i in items]
            )
        return [out.float() for out in self.dit(inputs, self.attention)]

    def guide(self, outputs: dict[str, torch.Tensor], guidance_scale: float) -> torch.Tensor:
        """The pipeline's rule: neg + scale * (pos - neg) under guidance, else the prediction."""
        if UNCOND not in outputs:
            return outputs[COND]
        return outputs[UNCOND] + guidance_scale * (outputs[COND] - outputs[UNCOND])

    def step(self, state: DenoiseState, guided: torch.Tensor) -> torch.Tensor:
        return state.sampler.step(guided, state.latents)

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        request.tensors[LATENTS] = state.latents
        state.condition.pop(REFERENCES, None)

    def warmup_item(self, size) -> DenoiseItem:
        """A zero item of a config compile size (None: 1024x1024) for the boot warmup."""
        rows, cols = self.geometry.latent_grid(*self._image_size(size))
        latents = torch.zeros(self.config.transformer.in_channels, rows, cols, device=self.device)
        text = torch.zeros(
            self.config.max_sequence_length, self.config.transformer.joint_attention_dim, device=self.device
        )
        return DenoiseItem("warmup", COND, latents, 500.0, 0.5, 0, text, {})

    def warmup_items(self, size) -> list[DenoiseItem]:
        """The boot warmup's items of a compile size: text-to-image, and an edit with the warmup's
        reference images (their tokens lengthen the pack; their rotary tables are built once)."""
        t2i = self.warmup_item(size)
        uploaded = warmup_reference_size(*self._image_size(size))
        if uploaded is None:
            return [t2i]
        width, height = reference_pixel_size(*uploaded, vae_scale=self.geometry.vae_scale)
        rows, cols = self.geometry.latent_grid(width, height)
        channels = self.config.transformer.in_channels
        references = [
            torch.zeros(channels, rows, cols, device=self.device) for _ in range(WARMUP_NUM_REFERENCES)
        ]
        edit = dataclasses.replace(t2i, condition={REFERENCES: references})
        return [t2i, edit]

    # ---- 4. decode (vae_decoder node) -------------------------------------------------------

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final latents [128, h, w] -> uint8 [1, H, W, 3] on the device (float32, as at warmup)."""
        latents = latents.to(self.device, torch.float32)
        return self.vae.decode_frames(latents) if self.decoder is None else self.decoder(latents)

    def warmup_decode(self, size, index: int) -> None:
        """Compile and check one size's decode on seeded random latents."""
        rows, cols = self.geometry.latent_grid(*self._image_size(size))
        channels = self.config.vae.patchified_channels
        latents = seeded_noise((channels, rows, cols), seed=index, device=self.device)
        if self.decoder is None:
            self.decode(latents)
        else:
            self.decoder.warm(latents)  # inline: a configured size never waits for the compile thread

    @staticmethod
    def _image_size(size) -> tuple[int, int]:
        return DEFAULT_WARMUP_SIZE if size is None else (size.width, size.height)
