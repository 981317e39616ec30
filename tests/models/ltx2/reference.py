"""diffusers' LTX-2 transformer driven the way LTX2Pipeline / LTX2ImageToVideoPipeline drive it, one
item at a time, returning unpacked outputs: the reference our packed DiT is checked against."""

from __future__ import annotations

import numpy as np
import torch

from mstar.models.ltx2.dit_pack import DiTInput


def snr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-noise ratio of `ours` against `reference` in dB; inf when identical."""
    noise = float(torch.sum((ours.double() - reference.double()) ** 2))
    if noise == 0.0:
        return float("inf")
    return 10 * float(np.log10(float(torch.sum(reference.double() ** 2)) / noise))


def psnr_db(ours: np.ndarray, reference: np.ndarray, peak: float = 1.0) -> float:
    """PSNR of frames in [0, peak]; inf when identical."""
    mse = float(np.mean((np.asarray(ours, dtype=np.float64) - np.asarray(reference, dtype=np.float64)) ** 2))
    if mse == 0.0:
        return float("inf")
    return 10 * float(np.log10(peak**2 / mse))


def diffusers_forward(model, item: DiTInput, perturbed_blocks=()) -> tuple[torch.Tensor, torch.Tensor]:
    """One item through diffusers' LTX2VideoTransformer3DModel: (video [C, F, H, W], audio [C, L, M])."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import LTX2Pipeline

    config = model.config
    pt, p = config.patch_size_t, config.patch_size
    device, dtype = item.video_latents.device, item.video_text.dtype  # the pipeline casts to the text's
    _, frames, height, width = item.video_latents.shape
    _, audio_frames, mel_bins = item.audio_latents.shape
    video = LTX2Pipeline._pack_latents(item.video_latents[None], p, pt).to(dtype)
    audio = LTX2Pipeline._pack_audio_latents(item.audio_latents[None]).to(dtype)
    timestep = torch.tensor([item.timestep], device=device)
    video_timestep = timestep
    if item.num_clean_frames:
        mask = torch.zeros(1, 1, frames, height, width, device=device)
        mask[:, :, : item.num_clean_frames] = 1.0
        mask = LTX2Pipeline._pack_latents(mask, p, pt).squeeze(-1)
        video_timestep = timestep.unsqueeze(-1) * (1 - mask)  # as LTX2ImageToVideoPipeline
    kwargs = {}
    if item.perturbed:
        kwargs = {"spatio_temporal_guidance_blocks": list(perturbed_blocks)}
    with torch.no_grad():
        video_out, audio_out = model(
            hidden_states=video,
            audio_hidden_states=audio,
            encoder_hidden_states=item.video_text[None],
            audio_encoder_hidden_states=item.audio_text[None],
            timestep=video_timestep,
            audio_timestep=timestep,
            sigma=timestep,
            num_frames=frames // pt,
            height=height // p,
            width=width // p,
            fps=item.frame_rate,
            audio_num_frames=audio_frames,
            isolate_modalities=item.isolated,
            use_cross_timestep=item.use_cross_timestep,
            return_dict=False,
            **kwargs,
        )
    video_out = LTX2Pipeline._unpack_latents(video_out, frames // pt, height // p, width // p, p, pt)[0]
    audio_out = LTX2Pipeline._unpack_audio_latents(audio_out, audio_frames, mel_bins)[0]
    return video_out, audio_out
