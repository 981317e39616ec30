"""Cosmos3's parity hook (its bench entry's `parity`): Cosmos3OmniPipeline written with random
weights of the model's real config (cosmos3-edge or cosmos3-nano; tiny: the CPU test configs of the
same backbones), the Wan VAE and the offline byte-level tokenizer, loaded back and run beside our
nodes by mstar.bench.parity. Variants: t2v (the default), t2i (one frame) and i2v (a seeded first
frame).

There is no text encoder: the prompt's token ids go into the transformer's understanding pathway,
so the prompt rows compare our token ids of both labels with the pipeline's tokenize_prompt, and
the generation rows compare one step's prediction of the generation pathway (our prefixes read from
the KV pool, both labels packed) with Cosmos3OmniTransformer's full forward on the same input, held
to MAX_GENERATION_REL_ERR. The folder's scheduler is written with the recipe's flow shift, so the
pipeline (which reads its scheduler as saved) samples as we do.

Nano at full size runs a 1-step case and a 2-step guided one (its recipe's 20 steps do not fit one
device call beside Edge's run; `--steps 20` gives them)."""

from __future__ import annotations

import dataclasses
from functools import partial
from pathlib import Path
from typing import Any

from mstar.bench.parity import ParityCase, ParityFamily, other_attention_kernels, parity_row, rel_err
from mstar.bench.parity_families import (
    PROMPT,
    SEED,
    cast_like_pretrained,
    device_dtype,
    free_device_memory,
    seeded_generator,
    seeded_image,
)
from mstar.models.cosmos3.config import Cosmos3Config

VARIANTS = ("t2v", "t2i", "i2v")
BACKBONES = {"cosmos3-edge": "edge", "cosmos3-nano": "nano"}
NANO_GUIDED_STEPS = 2
MAX_GENERATION_REL_ERR = 2e-2  # bf16 at full size; float32 on the CPU agrees to ~1e-6
# (timestep, clean latent frames) of the generation rows: a t2v step, and i2v's clean first frame
GENERATION_INPUTS = ((999.0, ()), (500.0, (0,)))


def cosmos3_parity(
    variant: str | None = None, tiny: bool = False, model: str = "cosmos3-edge"
) -> ParityFamily:
    from mstar.models.cosmos3.config import tiny_cosmos3_config
    from mstar.models.cosmos3.model import Cosmos3NanoSpec, Cosmos3Spec, TinyCosmos3Spec

    variant = variant or "t2v"
    if variant not in VARIANTS:
        raise ValueError(f"{model}: variant must be one of {', '.join(VARIANTS)}, got '{variant}'")
    if model not in BACKBONES:
        raise ValueError(f"no Cosmos3 parity for '{model}' (have: {', '.join(BACKBONES)})")
    nano = BACKBONES[model] == "nano"
    if tiny:
        spec = TinyCosmos3Spec(tiny_cosmos3_config(BACKBONES[model]))
    else:
        spec = Cosmos3NanoSpec() if nano else Cosmos3Spec()
    config = spec.config
    r = config.recipe
    if variant == "t2i":
        width, height, num_frames = r.image_width, r.image_height, 1
    else:
        width, height, num_frames = r.video_width, r.video_height, r.num_frames
    image = seeded_image(height, width, SEED) if variant == "i2v" else None
    guided_steps = NANO_GUIDED_STEPS if nano and not tiny else r.num_inference_steps
    return ParityFamily(
        model=model,
        variant=variant,
        spec=spec,
        request={
            "prompt": PROMPT,
            "width": width,
            "height": height,
            "num_frames": num_frames,
            "fps": int(r.fps),
            "seed": SEED,
        },  # fmt: skip
        cases=[
            ParityCase("1 step", 1, 1.0),
            ParityCase(f"{guided_steps} steps", guided_steps, r.guidance_scale),
        ],
        write_folder=partial(write_folder, config),
        load_reference=load_reference,
        encode_reference=None,
        run_reference=partial(run_pipeline, image=image),
        input_image=image,
        prompt_rows=partial(prompt_rows, spec),
        dit_rows=partial(generation_rows, spec),
        notes=["no text encoder: the prompt rows count token ids that differ from the pipeline's"],
    )


def folder_config(config: Cosmos3Config) -> Cosmos3Config:
    """The config with the recipe's flow shift in its scheduler (what both sides then read)."""
    shift = config.recipe.flow_shift
    if shift is None:
        return config
    return dataclasses.replace(config, scheduler=config.scheduler.with_flow_shift(shift))


def diffusers_vae_config(config: Cosmos3Config) -> dict[str, Any]:
    """AutoencoderKLWan's keyword arguments (lists where diffusers concatenates them)."""
    values = dataclasses.asdict(config.vae)
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


def write_folder(config: Cosmos3Config, folder: Path, device: str, seed: int) -> None:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    from mstar.models.checkpoint import randomize_
    from mstar.models.cosmos3.reference import built_in, scheduler_dict
    from mstar.models.cosmos3.text import offline_tokenizer

    config = folder_config(config)
    torch.manual_seed(seed)
    # no action head (Edge's checkpoint has one; its mode is refused)
    kwargs = {**config.transformer.to_dict(), "action_gen": False}
    dtype = device_dtype(device)
    with built_in(device, dtype):  # Nano's 14.6B parameters made in bf16, not float32
        transformer = Cosmos3OmniTransformer(**kwargs)
    # its fp32 modules cast first, so their random values have float32 precision
    transformer = randomize_(cast_like_pretrained(transformer, dtype), seed)
    with torch.device(device):
        vae = randomize_(AutoencoderKLWan(**diffusers_vae_config(config)), seed + 1)  # float32
    pipe = Cosmos3OmniPipeline(
        transformer=transformer.eval(), text_tokenizer=offline_tokenizer(), vae=vae.eval(),
        scheduler=UniPCMultistepScheduler(**scheduler_dict(config)), enable_safety_checker=False,
        default_use_system_prompt=config.pipeline.default_use_system_prompt,
        use_native_flow_schedule=config.pipeline.use_native_flow_schedule,
    )  # fmt: skip
    pipe.save_pretrained(str(folder))
    del pipe, transformer, vae
    free_device_memory(device)


def load_reference(folder: Path, device: str) -> Any:
    from mstar.models.cosmos3.reference import load_pipeline

    return load_pipeline(folder, device, device_dtype(device))


def run_pipeline(pipe: Any, fields: dict[str, Any], output_type: str, image: Any = None) -> Any:
    """The pipeline's first output: latents [C, F', h, w] (normalised, as ours) or frames
    [F, H, W, 3] in [0, 1]."""
    from PIL import Image

    out = pipe(
        fields["prompt"], negative_prompt=fields.get("negative_prompt"),
        image=None if image is None else Image.fromarray(image), num_frames=fields["num_frames"],
        height=fields["height"], width=fields["width"], fps=float(fields["fps"]),
        num_inference_steps=fields["num_inference_steps"], guidance_scale=fields["guidance_scale"],
        generator=seeded_generator(fields), output_type=output_type,
    ).video  # fmt: skip
    return out[0] if output_type == "latent" else out


def prompt_rows(spec: Any, pipe: Any, nodes: dict[str, Any], fields: dict[str, Any]) -> list[dict[str, Any]]:
    """Our token ids of both labels (the default negative prompt '') against tokenize_prompt's."""
    from mstar.graph import GenerationParams
    from mstar.models.cosmos3.geometry import COND, UNCOND

    params = spec.validate(GenerationParams(**fields, guidance_scale=2.0))  # both labels
    ours = nodes["dit"].pipeline.prompt_ids(params)
    cond, uncond = pipe.tokenize_prompt(
        params.prompt, negative_prompt=None, num_frames=params.num_frames, height=params.height,
        width=params.width, fps=float(params.fps),
    )  # fmt: skip
    rows = []
    for quantity, label, theirs in (
        ("prompt token ids", COND, cond),
        ("negative prompt token ids ('')", UNCOND, uncond),
    ):
        mine = ours[label]
        differing = sum(a != b for a, b in zip(mine, theirs, strict=False)) + abs(len(mine) - len(theirs))
        rows.append(parity_row(quantity, "-", "ids differing", differing, None, "-", num_tokens=len(theirs)))
    return rows


def generation_rows(
    spec: Any, pipe: Any, nodes: dict[str, Any], fields: dict[str, Any], device: str
) -> list[dict[str, Any]]:
    """One step's prediction of the generation pathway for both labels, as served (each label's
    prefix from the KV pool, the two packed in one forward), against Cosmos3OmniTransformer's
    full forward on the same latents; the yardstick is that forward under other SDPA kernels."""
    import torch

    from mstar.engine.kv.prefix import PagedPrefixKV
    from mstar.graph import GenerationParams
    from mstar.models.cosmos3.geometry import latent_shape
    from mstar.models.cosmos3.reference import diffusers_velocity
    from mstar.models.cosmos3.transformer import VisionInput

    pipeline = nodes["dit"].pipeline
    params = spec.validate(GenerationParams(**fields, guidance_scale=2.0))  # both labels
    ids = pipeline.prompt_ids(params)
    config = pipeline.config
    shape = latent_shape(config.vae, params.num_frames, params.height, params.width)
    latents = torch.randn(shape, generator=torch.Generator().manual_seed(params.seed)).to(pipeline.device)
    reference = partial(
        diffusers_velocity, pipe.transformer, fps=float(params.fps),
        temporal_compression=config.vae.scale_factor_temporal,
    )  # fmt: skip
    held = pipeline.understand(params)
    rows = []
    try:
        labels = list(held)
        prefix = PagedPrefixKV(pipeline.prefixes.pool, [held[label] for label in labels])
        for timestep, clean in GENERATION_INPUTS:
            if clean and shape[1] == 1:
                continue  # an image has no frame to keep clean
            case = f"t={timestep:.0f}" + (", first frame clean" if clean else "")
            items = [VisionInput(latents, timestep, float(params.fps), clean) for _ in labels]
            with torch.inference_mode():
                ours = pipeline.dit.generate(items, prefix, pipeline.dense)
                for label, out in zip(labels, ours, strict=True):
                    theirs = reference(ids[label], latents, timestep, clean_frames=clean)
                    with other_attention_kernels(device):
                        other = reference(ids[label], latents, timestep, clean_frames=clean)
                    rows.append(parity_row(
                        f"generation pathway output ({label})", case, "rel err", rel_err(out, theirs),
                        rel_err(other, theirs), "reference, other SDPA kernels",
                        limit=MAX_GENERATION_REL_ERR, num_tokens=len(ids[label]),
                    ))  # fmt: skip
    finally:
        for prefix_pages in held.values():
            pipeline.prefixes.release(prefix_pages)
    return rows
