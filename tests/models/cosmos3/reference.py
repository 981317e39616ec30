"""diffusers' Cosmos3 as the parity reference: one full transformer forward (the understanding
pathway recomputed, as the pipeline does at every step and label), and our pieces driven by a
small loop written the way Cosmos3OmniPipeline.__call__ runs, for the end-to-end comparison.

    velocity = diffusers_velocity(theirs, input_ids, latents, timestep, clean_frames=(0,))
    frames = run_our_loop(folder, request)            # [F, 3, H, W] in [0, 1], like output_type="pt"
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from mstar.engine.attention import PrefixAttention, StackedPrefixKV, build_attention
from mstar.models.cosmos3.conditioning import encode_image, initial_latents, preprocess_image
from mstar.models.cosmos3.config import Cosmos3Config
from mstar.models.cosmos3.geometry import IMAGE_CONDITION_FRAMES, UNCOND, guidance_labels, latent_shape
from mstar.models.cosmos3.modes import Mode, select_mode
from mstar.models.cosmos3.reference import diffusers_velocity  # noqa: F401 (tests import it from here)
from mstar.models.cosmos3.sampling import guide, make_sampler
from mstar.models.cosmos3.text import PromptRequest, load_tokenizer, prompt_token_ids
from mstar.models.cosmos3.transformer import VisionInput
from mstar.models.cosmos3.weights import load_transformer, load_vae
from mstar.models.wan22.vae import denormalize_latents


@dataclass
class LoopRequest:
    prompt: str
    num_frames: int
    height: int
    width: int
    num_inference_steps: int = 3
    guidance_scale: float = 6.0
    seed: int = 0
    fps: float = 24.0
    negative_prompt: str | None = None
    image: object = None  # PIL image for image-to-video
    flow_shift: float | None = None  # None: the folder's scheduler as saved


@dataclass
class LoopResult:
    frames: torch.Tensor  # [F, 3, H, W] in [0, 1]
    latents: torch.Tensor  # final [C, F', h, w]
    num_understanding_forwards: int
    num_generation_forwards: int
    prefix_lens: dict[str, int] = field(default_factory=dict)


def run_our_loop(folder: Path, request: LoopRequest) -> LoopResult:
    """Our parts, in float32 on the CPU: prompt -> prefixes once -> generation per step -> decode."""
    config = Cosmos3Config.from_folder(folder)
    transformer = load_transformer(folder, "cpu", torch.float32, config=config)
    vae = load_vae(folder, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    dense = PrefixAttention(attention)
    mode = select_mode(request.num_frames, request.image is not None)
    prompt = PromptRequest(
        request.prompt,
        request.num_frames,
        request.height,
        request.width,
        request.fps,
        request.negative_prompt,
    )
    ids = prompt_token_ids(load_tokenizer(folder), prompt, config.pipeline.default_use_system_prompt)
    labels = guidance_labels(request.guidance_scale)
    with torch.no_grad():
        prefixes = {
            label: transformer.understand(ids.uncond if label == UNCOND else ids.cond, attention)
            for label in labels
        }
        image_latents = None
        if mode is Mode.IMAGE_TO_VIDEO:
            image_latents = encode_image(vae, preprocess_image(request.image, request.height, request.width))
        shape = latent_shape(config.vae, request.num_frames, request.height, request.width)
        latents = initial_latents(shape, request.seed, image_latents)
        clean = IMAGE_CONDITION_FRAMES if mode is Mode.IMAGE_TO_VIDEO else ()
        sampler = make_sampler(config, request.num_inference_steps, request.flow_shift)
        num_generation_forwards = 0
        for timestep in sampler.timesteps:
            items = [VisionInput(latents, float(timestep), request.fps, clean) for _ in labels]
            outputs = transformer.generate(
                items, StackedPrefixKV([prefixes[label] for label in labels]), dense
            )
            num_generation_forwards += 1
            velocity = guide(outputs[0], outputs[1] if len(outputs) > 1 else None, request.guidance_scale)
            latents = sampler.step(velocity, latents)
        video = vae.decode(denormalize_latents(latents.unsqueeze(0), vae.config))[0]  # [3, F, H, W]
    return LoopResult(
        frames=(video / 2 + 0.5).clamp(0, 1).permute(1, 0, 2, 3),
        latents=latents,
        num_understanding_forwards=transformer.num_understanding_forwards,
        num_generation_forwards=num_generation_forwards,
        prefix_lens={label: int(prefix.shape[2]) for label, prefix in prefixes.items()},
    )


def run_diffusers(pipe, request: LoopRequest) -> torch.Tensor:
    """Cosmos3OmniPipeline's frames [F, 3, H, W] in [0, 1] for the same request (a recipe's flow
    shift set as the published examples set it; the pipeline's scheduler is restored after)."""
    saved = pipe.scheduler
    if request.flow_shift is not None:
        from diffusers import UniPCMultistepScheduler

        pipe.scheduler = UniPCMultistepScheduler.from_config(
            saved.config, flow_shift=request.flow_shift, use_karras_sigmas=False
        )
    try:
        with torch.no_grad():
            output = _call(pipe, request)
    finally:
        pipe.scheduler = saved
    return output.video


def _call(pipe, request: LoopRequest):
    return pipe(
        request.prompt,
        negative_prompt=request.negative_prompt,
        image=request.image,
        num_frames=request.num_frames,
        height=request.height,
        width=request.width,
        fps=request.fps,
        num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale,
        generator=torch.Generator("cpu").manual_seed(request.seed),
        output_type="pt",
    )


def psnr_db(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Peak signal-to-noise ratio of [0, 1] frames, in dB (inf when identical)."""
    mse = float(((ours.double() - theirs.double()) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(1.0 / mse)).item()
