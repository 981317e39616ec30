"""LTX-2's pipeline, readable top to bottom in LTX2Pipeline's order: encode the prompts, encode the
conditioning image (image-to-video), prepare the latents, predict over the packed batch, guide and
step, finish, decode the video and the audio. The shared nodes drive it
(mstar.models.text_encoding, mstar.diffusion.denoise, mstar.diffusion.vae_nodes, and this family's
audio decode node); each worker builds it with the components it holds.

A request's latents are a pair, (video [C, F', H', W'], audio [C, L, M]), both float32, stepped on
one schedule by two equal samplers (the pipeline's deep copy of its scheduler). Every guidance label
of every request in a step is one item of one packed DiT forward (video, audio and both cross
attentions ragged). Guidance runs on the data estimates x0 = x - sigma * v (sampling.guide), which
needs the sample and the step's sigma: `guide` hands the labels' velocities on, and `step` applies
the rule with the request's state.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from mstar.diffusion.denoise import DenoiseItem, DenoiseStart, DenoiseState, kept_per_label
from mstar.diffusion.vae_nodes import INPUT_REFERENCE, LATENTS
from mstar.graph import RequestState
from mstar.models.ltx2 import geometry
from mstar.models.ltx2.config import LTX2Config
from mstar.models.ltx2.dit import DiTInput
from mstar.models.ltx2.geometry import COND, ISOLATED, PERTURBED, UNCOND
from mstar.models.ltx2.image import condition_image
from mstar.models.ltx2.model import LTX2Params, LTX2Spec
from mstar.models.ltx2.sampling import (
    StreamGuidance,
    guide,
    initial_noise,
    make_sampler,
    resolve_audio_scales,
)
from mstar.models.ltx2.text_encoder import split_prompt_embeds
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS

logger = logging.getLogger(__name__)

IMAGE_LATENTS = "image_latents"  # normalised VAE latents of the conditioning image [C, 1, H', W']
AUDIO_LATENTS = "audio_latents"  # the loop's final audio latents [C, L, M] (requests with audio)
AUDIO = "audio"  # float32 [channels, samples] on the host: what the audio decoder leaves
REQUEST = "ltx2"  # condition key: the request's RequestSetup
TEXT_OF_LABEL = {COND: PROMPT_EMBEDS, UNCOND: NEGATIVE_PROMPT_EMBEDS}
# Condition key: {text: LTX2DiT.text_kv(...)}, per text of the request (isolated and perturbed
# passes read the prompt's), filled at its first step; the node drops it at the last.
TEXT_KV = "text_kv"


@dataclass
class RequestSetup:
    """What a request's steps read besides its latents (DenoiseState.condition[REQUEST])."""

    audio_sampler: Any
    video_scales: StreamGuidance
    audio_scales: StreamGuidance
    frame_rate: float
    num_clean_frames: int = 0  # leading latent frames kept clean (image-to-video's first frame)


def stream_scales(params: LTX2Params) -> tuple[StreamGuidance, StreamGuidance]:
    video = StreamGuidance(
        params.guidance_scale, params.stg_scale, params.modality_scale, params.guidance_rescale
    )
    audio = StreamGuidance(
        params.audio_guidance_scale, params.audio_stg_scale, params.audio_modality_scale,
        params.audio_guidance_rescale,
    )  # fmt: skip
    return video, resolve_audio_scales(video, audio)


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Decoded video [3, F, H, W] about [-1, 1] -> uint8 [F, H, W, 3], as diffusers' postprocess
    and numpy_to_pil round it."""
    pixels = (video.float() / 2 + 0.5).clamp(0, 1)
    return (pixels * 255).round().to(torch.uint8).permute(1, 2, 3, 0).contiguous()


class LTX2Pipeline:
    """Components (each None where this worker does not hold it): `text_encoder`
    (text_encoder.PromptEncoder), `dit` (LTX2DiT) with its `attention` resource, `vae`
    (LTX2VideoVAE: its encoder for image-to-video, its decoder), `audio_decoder` (LTX2AudioDecoder)
    and `vocoder` (LTX2Vocoder)."""

    def __init__(
        self, config: LTX2Config, device: str | torch.device, dtype: torch.dtype,
        text_encoder=None, dit=None, attention=None, vae=None, audio_decoder=None, vocoder=None,
    ):  # fmt: skip
        self.config = config
        self.spec = LTX2Spec(config)
        self.device = torch.device(device)
        self.dtype = dtype
        self.text_encoder, self.dit, self.attention = text_encoder, dit, attention
        self.vae, self.audio_decoder, self.vocoder = vae, audio_decoder, vocoder
        self.stg_blocks = tuple(config.defaults.spatio_temporal_guidance_blocks)

    # ---- 1. prompts (text_encoder node) -----------------------------------------------------

    def prompts(self, params: LTX2Params) -> dict[str, str]:
        """The prompt, and the negative prompt when the request's guidance runs an uncond pass."""
        labels = self.spec.labels(params)
        texts = {PROMPT_EMBEDS: params.prompt}
        if UNCOND in labels:
            texts[NEGATIVE_PROMPT_EMBEDS] = params.negative_prompt
        return texts

    def encode_prompt(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [max_sequence_length, Dv + Da] embedding per prompt, each encoded alone."""
        return self.text_encoder.encode(prompts)

    # ---- 2. the conditioning image (vae_encoder node, image-to-video) ------------------------

    @torch.inference_mode()
    def encode_image(self, request: RequestState) -> None:
        """input_reference uint8 [H, W, 3] -> request.tensors["image_latents"] [C, 1, H', W']."""
        if INPUT_REFERENCE not in request.tensors:
            raise ValueError(
                f"request {request.request_id}: image-to-video needs an '{INPUT_REFERENCE}' image"
            )
        params = request.params
        image = request.tensors.pop(INPUT_REFERENCE)
        image = image.cpu().numpy() if isinstance(image, torch.Tensor) else image
        pixels = condition_image(image, params.height, params.width, self.config.defaults.image_crf)
        weight = next(self.vae.parameters())
        latents = self.vae.encode(pixels[:, :, None].to(weight.device, weight.dtype)).float()
        request.tensors[IMAGE_LATENTS] = self.vae.normalize(latents)[0]

    # ---- 3. the denoise loop (dit node) -----------------------------------------------------

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params: LTX2Params = request.params
        video_geo = geometry.video_geometry(
            params.num_frames, params.height, params.width, params.fps, self.config
        )
        audio_geo = geometry.audio_geometry(params.num_frames, params.fps, self.config)
        video, audio = initial_noise(params.seed, video_geo.latent_shape, audio_geo.latent_shape)
        num_clean = 0
        if IMAGE_LATENTS in request.tensors:
            clean = request.tensors.pop(IMAGE_LATENTS).to(torch.float32).cpu()
            num_clean = clean.shape[1]
            video[:, :num_clean] = clean
        num_video = geometry.num_video_tokens(video_geo, self.config.dit)
        steps, scheduler = params.num_inference_steps, self.config.scheduler
        video_scales, audio_scales = stream_scales(params)
        setup = RequestSetup(
            audio_sampler=make_sampler(steps, num_video, scheduler),
            video_scales=video_scales,
            audio_scales=audio_scales,
            frame_rate=float(params.fps),
            num_clean_frames=num_clean,
        )
        texts = {
            label: request.tensors[TEXT_OF_LABEL.get(label, PROMPT_EMBEDS)].to(self.device, self.dtype)
            for label in self.spec.labels(params)
        }
        return DenoiseStart(
            latents=(video.to(self.device), audio.to(self.device)),
            sampler=make_sampler(steps, num_video, scheduler),
            num_tokens=num_video + geometry.num_audio_tokens(audio_geo),
            texts=texts,
            guidance_scale=float(params.guidance_scale),
            condition={REQUEST: setup},
        )

    @torch.inference_mode()
    def predict(self, items: list[DenoiseItem]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every item of the step (each request's labels) through one packed DiT forward:
        (video velocity, audio velocity) per item. The text cross-attention keys and values of
        each of a request's texts are computed at its first step and kept."""
        video_dim = self.config.connectors.video_dim
        inputs = []
        for item in items:
            setup: RequestSetup = item.condition[REQUEST]
            video, audio = item.latents
            video_text, audio_text = split_prompt_embeds(item.text, video_dim)
            inputs.append(
                DiTInput(
                    video,
                    audio,
                    item.timestep,
                    video_text,
                    audio_text,
                    frame_rate=setup.frame_rate,
                    num_clean_frames=setup.num_clean_frames,
                    isolated=item.label == ISOLATED,
                    perturbed=item.label == PERTURBED,
                    text_kv=self._kept_text_kv(item, video_text, audio_text),
                )  # fmt: skip
            )
        return self.dit(inputs, self.attention, self.stg_blocks)

    def _kept_text_kv(self, item: DenoiseItem, video_text, audio_text):
        """The item's text keys and values, once per text of the request (None where the model
        modulates its text per step)."""
        if not self.dit.keeps_text_kv:
            return None
        text = TEXT_OF_LABEL.get(item.label, PROMPT_EMBEDS)
        return kept_per_label(item, TEXT_KV, lambda: self.dit.text_kv(video_text, audio_text), text)

    def guide(self, outputs: dict[str, tuple[torch.Tensor, torch.Tensor]], guidance_scale: float):
        """The labels' velocities, as they are: the rule works on x0 and needs the sample (step)."""
        return outputs

    def step(self, state: DenoiseState, guided: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        """LTX2Pipeline's guidance on both streams, then one Euler step of each; the conditioning
        frame stays clean."""
        setup: RequestSetup = state.condition[REQUEST]
        video, audio = state.latents
        sigma = state.sampler.sigmas[state.sampler.step_index]
        video_velocity = guide(video, sigma, {k: v[0] for k, v in guided.items()}, setup.video_scales)
        audio_velocity = guide(audio, sigma, {k: v[1] for k, v in guided.items()}, setup.audio_scales)
        stepped = state.sampler.step(video_velocity, video)
        audio = setup.audio_sampler.step(audio_velocity, audio)
        if setup.num_clean_frames:
            stepped[:, : setup.num_clean_frames] = video[:, : setup.num_clean_frames]
        return stepped, audio

    def finish(self, request: RequestState, state: DenoiseState) -> None:
        """The final video latents to request.tensors["latents"], the audio's to "audio_latents"
        (requests that want their audio)."""
        video, audio = state.latents
        state.texts = dict.fromkeys(state.texts)
        request.tensors[LATENTS] = video
        if request.params.audio:
            request.tensors[AUDIO_LATENTS] = audio

    def warmup_item(self, size) -> DenoiseItem:
        """A zero item of a config compile size (None: the default size) for the boot warmup."""
        width, height, num_frames = self._clip_size(size)
        fps = round(self.config.defaults.frame_rate)
        video = geometry.video_geometry(num_frames, height, width, fps, self.config)
        audio = geometry.audio_geometry(num_frames, fps, self.config)
        latents = (
            torch.zeros(video.latent_shape, device=self.device),
            torch.zeros(audio.latent_shape, device=self.device),
        )
        c = self.config.connectors
        text = torch.zeros(
            self.config.defaults.max_sequence_length, c.video_dim + c.audio_dim, device=self.device
        )
        setup = RequestSetup(None, StreamGuidance(), StreamGuidance(), float(fps))
        return DenoiseItem("warmup", COND, latents, 999.0, 1.0, 0, text.to(self.dtype), {REQUEST: setup})

    def warmup_steps(self, size) -> list[list[DenoiseItem]]:
        """The boot warmup's packed steps of a compile size: one item, two, then a request's guided
        step at the defaults (cond, uncond, isolated): the isolated items skip the audio-video cross
        attention, and a pack whose cross part is shorter than the whole is its own graph."""
        item = self.warmup_item(size)
        labels = self.spec.geometry.labels(self.config.defaults.guidance_scale)
        guided = [dataclasses.replace(item, label=label) for label in labels]
        return [[item], [item, item], guided]

    # ---- 4. decode (vae_decoder and audio_decoder nodes) --------------------------------------

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Final video latents [C, F', H', W'] -> uint8 frames [F, H, W, 3] (decode timestep 0: the
        released decoder takes none). The latents are cast to the DiT's dtype before they are
        denormalized, as the pipeline casts them to its prompt embeddings' (bf16 on a GPU)."""
        weight = next(self.vae.parameters())
        latents = self.vae.denormalize(latents.to(weight.device, self.dtype)[None])
        timestep = torch.full((1,), self.config.defaults.decode_timestep, device=weight.device)
        return to_uint8_frames(self.vae.decode(latents, timestep)[0])

    @torch.inference_mode()
    def decode_audio(self, latents: torch.Tensor) -> torch.Tensor:
        """Final audio latents [C, L, M] -> waveform float32 [channels, samples] on the host."""
        weight = next(self.audio_decoder.parameters())
        latents = self.audio_decoder.denormalize(latents.to(weight.device, torch.float32)[None])
        mel = self.audio_decoder.decode(latents)
        return self.vocoder(mel)[0].float().cpu()

    def warmup_decode(self, size, index: int) -> None:
        width, height, num_frames = self._clip_size(size)
        fps = round(self.config.defaults.frame_rate)
        shape = geometry.video_geometry(num_frames, height, width, fps, self.config).latent_shape
        self.decode(torch.zeros(shape))

    def _clip_size(self, size) -> tuple[int, int, int]:
        d = self.config.defaults
        if size is None:
            return d.width, d.height, d.num_frames
        return size.width, size.height, size.num_frames or d.num_frames
