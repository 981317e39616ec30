"""FLUX.2 [klein]'s full-size parity hook (its bench entry's `parity`): Flux2KleinPipeline written
with random weights (the distilled 4B shapes; the Qwen3-4B text encoder), loaded back and run
beside our nodes by mstar.bench.parity. Text-to-image (the harness's one request shape); the edit
path's parity is the CPU test of the tiny config (tests/models/flux2_klein/test_serving.py).

The pipeline's "latent" output is the VAE's [1, 32, 2h, 2w]; ours is the transformer's grid
[128, h, w] (patchified, batch-normalised), so the reference's is brought to ours before the
comparison, with the folder's own statistics."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mstar.bench.parity import ParityCase, ParityFamily
from mstar.bench.parity_families import (
    PROMPT,
    SEED,
    cast_like_pretrained,
    device_dtype,
    free_device_memory,
    seeded_generator,
)
from mstar.models.flux2_klein.config import SchedulerConfig, VAEConfig, to_json_dict


def diffusers_vae_config(vae: VAEConfig) -> dict[str, Any]:
    num_blocks = len(vae.block_out_channels)
    return {
        **to_json_dict(vae),
        "down_block_types": ["DownEncoderBlock2D"] * num_blocks,
        "up_block_types": ["UpDecoderBlock2D"] * num_blocks,
    }


def scheduler_kwargs(scheduler: SchedulerConfig) -> dict[str, Any]:
    return dataclasses.asdict(scheduler)


def flux2_klein_parity(variant: str | None = None, tiny: bool = False) -> ParityFamily:
    from mstar.models.flux2_klein.config import KLEIN_4B, TINY
    from mstar.models.flux2_klein.geometry import DEFAULT_GUIDANCE_SCALE, DEFAULT_NUM_STEPS
    from mstar.models.flux2_klein.model import Flux2KleinSpec

    if variant not in (None, "t2i"):
        raise ValueError(f"flux2-klein-4b: the parity variant is t2i, got '{variant}'")
    config = TINY if tiny else KLEIN_4B

    class ParitySpec(Flux2KleinSpec):
        preset = config
        min_side = 16 if tiny else Flux2KleinSpec.min_side

    width, height = (64, 48) if tiny else (1024, 1024)
    return ParityFamily(
        model="flux2-klein-4b",
        variant="t2i",
        spec=ParitySpec(),
        request={"prompt": PROMPT, "width": width, "height": height, "seed": SEED},
        cases=[
            ParityCase("1 step", 1, 0.0),
            ParityCase(f"{DEFAULT_NUM_STEPS} steps", DEFAULT_NUM_STEPS, DEFAULT_GUIDANCE_SCALE),
        ],
        write_folder=lambda folder, device, seed: write_folder(config, folder, device, seed),
        load_reference=load_pipeline,
        encode_reference=lambda pipe, prompt: prompt_embeds(pipe, prompt, config),
        run_reference=lambda pipe, fields, output_type: run_pipeline(pipe, fields, output_type, config),
        notes=["the distilled checkpoint: guidance_scale is ignored (one label)"],
    )


def write_folder(config: Any, folder: Path, device: str, seed: int) -> None:
    import torch
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mstar.bench.parity_tokenizers import qwen_tokenizer
    from mstar.models.checkpoint import randomize_

    dtype = device_dtype(device)
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = cast_like_pretrained(
            randomize_(Flux2Transformer2DModel(**to_json_dict(config.transformer)), seed), dtype
        )
        vae = randomize_(AutoencoderKLFlux2(**diffusers_vae_config(config.vae)), seed + 1)
        with torch.no_grad():  # latent statistics of unit scale (a random variance could be negative)
            vae.bn.running_mean.zero_()
            vae.bn.running_var.fill_(1.0)
        text_encoder = Qwen3ForCausalLM._from_config(Qwen3Config(**config.text_encoder), dtype=dtype)
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler_kwargs(config.scheduler)),
        vae=vae.to(dtype).eval(), text_encoder=text_encoder.eval(), tokenizer=qwen_tokenizer(),
        transformer=transformer.eval(), is_distilled=config.is_distilled,
    )  # fmt: skip
    pipe.save_pretrained(str(folder))
    del pipe, transformer, vae, text_encoder
    free_device_memory(device)


def load_pipeline(folder: Path, device: str) -> Any:
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(str(folder), torch_dtype=device_dtype(device)).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def prompt_embeds(pipe: Any, prompt: str, config: Any) -> Any:
    embeds, _ = pipe.encode_prompt(
        prompt, device=pipe.device, max_sequence_length=config.max_sequence_length,
        text_encoder_out_layers=config.text_encoder_out_layers,
    )  # fmt: skip
    return embeds[0]


def run_pipeline(pipe: Any, fields: dict[str, Any], output_type: str, config: Any) -> Any:
    out = pipe(
        prompt=fields["prompt"], height=fields["height"], width=fields["width"],
        num_inference_steps=fields["num_inference_steps"], guidance_scale=fields["guidance_scale"],
        generator=seeded_generator(fields), output_type=output_type,
        max_sequence_length=config.max_sequence_length, text_encoder_out_layers=config.text_encoder_out_layers,
    ).images  # fmt: skip
    return transformer_grid(pipe, out) if output_type == "latent" else out


def transformer_grid(pipe: Any, latents: Any) -> Any:
    """The pipeline's VAE-space latents [1, 32, 2h, 2w] -> the transformer's grid [128, h, w]."""
    from mstar.models.flux2_klein.vae import patchify

    bn = pipe.vae.bn
    grid = patchify(latents.float())
    std = (bn.running_var.float() + pipe.vae.config.batch_norm_eps).sqrt()
    return ((grid - bn.running_mean.float()[None, :, None, None]) / std[None, :, None, None])[0]
