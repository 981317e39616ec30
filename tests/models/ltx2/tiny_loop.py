"""A small loop that drives our LTX-2 pieces the way LTX2Pipeline / LTX2ImageToVideoPipeline do (the
parity test's "ours"; the serving pipeline is built on the scaffold from the same pieces).

    pieces = load_pieces(folder)                     # a diffusers folder, through our loaders
    frames, waveform = generate(pieces, Request(prompt="a cat", seed=0))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from mstar.engine.attention import build_attention
from mstar.models.ltx2 import geometry, weights
from mstar.models.ltx2.dit import DiTInput
from mstar.models.ltx2.image import condition_image
from mstar.models.ltx2.presets import TINY
from mstar.models.ltx2.sampling import (
    StreamGuidance,
    guide,
    initial_noise,
    make_sampler,
    resolve_audio_scales,
)
from mstar.models.ltx2.text_encoder import PromptEncoder, build_gemma3, split_prompt_embeds


@dataclass
class Pieces:
    config: Any
    dit: Any
    encoder: PromptEncoder
    vae: Any
    audio_decoder: Any
    vocoder: Any
    attention: Any


def load_pieces(folder, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Pieces:
    path = str(folder)
    config = weights.load_configs(path, TINY)
    attention = build_attention("torch", device, dtype)
    connectors = weights.build_connectors(config.connectors, device, dtype, path)
    gemma = build_gemma3({}, device, dtype, path=f"{path}/text_encoder")
    encoder = PromptEncoder(
        gemma, weights.load_tokenizer(path), connectors, attention, device, TINY.defaults.max_sequence_length
    )
    return Pieces(
        config=config,
        dit=weights.build_dit(config.dit, device, dtype, path),
        encoder=encoder,
        vae=weights.build_video_vae(config.vae, device, dtype, path),
        audio_decoder=weights.build_audio_decoder(config.audio_vae, device, dtype, path),
        vocoder=weights.build_vocoder(config.vocoder, device, dtype, path),
        attention=attention,
    )


@dataclass
class Request:
    """LTX2Pipeline's arguments the loop reads (its defaults, at the tiny sizes)."""

    prompt: str
    seed: int
    negative_prompt: str = ""
    height: int = TINY.defaults.height
    width: int = TINY.defaults.width
    num_frames: int = TINY.defaults.num_frames
    frame_rate: float = TINY.defaults.frame_rate
    num_inference_steps: int = TINY.defaults.num_inference_steps
    video: StreamGuidance = field(default_factory=lambda: StreamGuidance(3.0, 1.0, 3.0, 0.7))
    audio: StreamGuidance = field(default_factory=lambda: StreamGuidance(7.0, 1.0, 3.0, 0.7))
    stg_blocks: tuple[int, ...] = (28,)
    image: Any = None  # uint8 [H, W, 3]: image-to-video
    image_crf: int = TINY.defaults.image_crf


def generate(pieces: Pieces, request: Request) -> tuple[np.ndarray, torch.Tensor]:
    """(frames float [F, H, W, 3] in [0, 1], waveform [channels, samples])."""
    config, r = pieces.config, request
    audio_scales = resolve_audio_scales(r.video, r.audio)
    video_geo = geometry.video_geometry(r.num_frames, r.height, r.width, r.frame_rate, config)
    audio_geo = geometry.audio_geometry(r.num_frames, r.frame_rate, config)
    labels = geometry.guidance_labels(
        r.video.guidance_scale, audio_scales.guidance_scale, r.video.stg_scale, audio_scales.stg_scale,
        r.video.modality_scale, audio_scales.modality_scale, r.stg_blocks, config.dit,
    )  # fmt: skip
    with torch.no_grad():
        clean = None
        if r.image is not None:  # the VAE encodes before the noise is drawn (it draws none)
            pixels = condition_image(r.image, r.height, r.width, r.image_crf)
            clean = pieces.vae.normalize(pieces.vae.encode(pixels[:, :, None]))[0]  # [C, 1, H', W']
        video, audio = initial_noise(r.seed, (1, *video_geo.latent_shape), (1, *audio_geo.latent_shape))
        video, audio = video[0], audio[0]
        if clean is not None:
            video[:, :1] = clean
        texts = _texts(pieces, r, labels)
        num_tokens = geometry.num_video_tokens(video_geo, config.dit)
        video_sampler = make_sampler(r.num_inference_steps, num_tokens, config.scheduler)
        audio_sampler = make_sampler(r.num_inference_steps, num_tokens, config.scheduler)
        for timestep in video_sampler.timesteps:
            sigma = video_sampler.sigmas[video_sampler.step_index]
            items = [
                DiTInput(
                    video,
                    audio,
                    float(timestep),
                    *texts[label],
                    frame_rate=r.frame_rate,
                    num_clean_frames=1 if clean is not None else 0,
                    isolated=label == geometry.ISOLATED,
                    perturbed=label == geometry.PERTURBED,
                )  # fmt: skip
                for label in labels
            ]
            outputs = dict(zip(labels, pieces.dit(items, pieces.attention, r.stg_blocks), strict=True))
            video_velocity = guide(video, sigma, {k: v[0] for k, v in outputs.items()}, r.video)
            audio_velocity = guide(audio, sigma, {k: v[1] for k, v in outputs.items()}, audio_scales)
            stepped = video_sampler.step(video_velocity, video)
            audio = audio_sampler.step(audio_velocity, audio)
            if clean is not None:
                stepped[:, :1] = video[:, :1]  # the conditioning frame stays clean
            video = stepped
        frames = pieces.vae.decode(pieces.vae.denormalize(video[None]))[0]  # [3, F, H, W]
        mel = pieces.audio_decoder.decode(pieces.audio_decoder.denormalize(audio[None]))
        waveform = pieces.vocoder(mel)[0]
    frames = (frames / 2 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).float().numpy()
    return frames, waveform


def _texts(pieces: Pieces, request: Request, labels) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    prompts = [request.prompt] + ([request.negative_prompt or ""] if geometry.UNCOND in labels else [])
    embeds = pieces.encoder.encode(prompts)
    video_dim = pieces.config.connectors.video_dim
    cond = split_prompt_embeds(embeds[0], video_dim)
    texts = {label: cond for label in labels}
    if geometry.UNCOND in labels:
        texts[geometry.UNCOND] = split_prompt_embeds(embeds[1], video_dim)
    return texts
