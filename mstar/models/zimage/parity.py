"""Z-Image-Turbo's full-size parity hook (its bench entry's `parity`): ZImagePipeline written with
random weights, loaded back and run beside our nodes by mstar.bench.parity."""

from __future__ import annotations

from functools import partial
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
from mstar.models.zimage.config import diffusers_vae_config


def zimage_parity(variant: str | None = None, tiny: bool = False) -> ParityFamily:
    from mstar.models.zimage.config import REAL, TINY
    from mstar.models.zimage.model import DEFAULT_GUIDANCE, DEFAULT_STEPS, ZImageSpec

    if variant not in (None, "t2i"):
        raise ValueError(f"z-image-turbo: the only variant is t2i, got '{variant}'")
    config = TINY if tiny else REAL
    spec = _tiny_zimage_spec(config) if tiny else ZImageSpec(config)
    width, height = (64, 48) if tiny else (1024, 1024)
    return ParityFamily(
        model="z-image-turbo",
        variant="t2i",
        spec=spec,
        request={"prompt": PROMPT, "width": width, "height": height, "seed": SEED},
        cases=[
            ParityCase("1 step", 1, 0.0),
            ParityCase(f"{DEFAULT_STEPS} steps", DEFAULT_STEPS, DEFAULT_GUIDANCE),
        ],
        write_folder=partial(write_zimage_folder, config),
        load_reference=load_zimage_pipeline,
        encode_reference=partial(zimage_prompt_embeds, max_sequence_length=config.max_sequence_length),
        run_reference=partial(run_zimage, max_sequence_length=config.max_sequence_length),
    )


def _tiny_zimage_spec(config: Any) -> Any:
    from mstar.models.zimage.model import ZImageSpec

    class TinyZImageSpec(ZImageSpec):
        """z-image-turbo with the tiny VAE's smaller minimum sizes."""

        min_side = 16
        min_pixels = 16 * 16

    return TinyZImageSpec(config)


def write_zimage_folder(config: Any, folder: Path, device: str, seed: int) -> None:
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3Model

    from mstar.bench.parity_tokenizers import qwen_tokenizer
    from mstar.models.checkpoint import randomize_
    from mstar.models.zimage.config import to_json_dict

    dtype = device_dtype(device)
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = cast_like_pretrained(
            randomize_(ZImageTransformer2DModel(**to_json_dict(config.dit)), seed), dtype
        )
        vae = randomize_(AutoencoderKL(**diffusers_vae_config(config.vae)), seed + 1).to(dtype)
        text_encoder = Qwen3Model._from_config(Qwen3Config(**config.text_encoder), dtype=dtype)
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=config.scheduler.num_train_timesteps, shift=config.scheduler.shift,
        use_dynamic_shifting=config.scheduler.use_dynamic_shifting,
    )  # fmt: skip
    pipe = ZImagePipeline(
        scheduler=scheduler, vae=vae.eval(), text_encoder=text_encoder.eval(), tokenizer=qwen_tokenizer(),
        transformer=transformer.eval(),
    )  # fmt: skip
    pipe.save_pretrained(str(folder))
    del pipe, transformer, vae, text_encoder
    free_device_memory(device)


def load_zimage_pipeline(folder: Path, device: str) -> Any:
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(str(folder), torch_dtype=device_dtype(device)).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def zimage_prompt_embeds(pipe: Any, prompt: str, max_sequence_length: int) -> Any:
    return pipe._encode_prompt(prompt, max_sequence_length=max_sequence_length)[0]


def run_zimage(pipe: Any, fields: dict[str, Any], output_type: str, max_sequence_length: int):
    return pipe(
        fields["prompt"], negative_prompt=fields.get("negative_prompt"), height=fields["height"],
        width=fields["width"], num_inference_steps=fields["num_inference_steps"],
        guidance_scale=fields["guidance_scale"], generator=seeded_generator(fields), output_type=output_type,
        max_sequence_length=max_sequence_length, return_dict=False,
    )[0]  # fmt: skip
