"""Wan2.2's full-size parity hook (its bench entry's `parity`): WanPipeline (t2v) and
WanImageToVideoPipeline with expand_timesteps (i2v) written with random weights, loaded back and
run beside our nodes by mstar.bench.parity."""

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
    seeded_image,
)


def wan_parity(variant: str | None = None, tiny: bool = False) -> ParityFamily:
    from mstar.models.wan22.config import Wan22Config, tiny_wan22_config
    from mstar.models.wan22.model import Wan22Spec

    variant = variant or "t2v"
    if variant not in ("t2v", "i2v"):
        raise ValueError(f"wan2.2-ti2v-5b: variant must be t2v or i2v, got '{variant}'")
    config = tiny_wan22_config() if tiny else Wan22Config()
    width, height, num_frames = (32, 32, 5) if tiny else (832, 480, 33)
    image = seeded_image(height, width, SEED) if variant == "i2v" else None
    steps, guidance = config.default_steps, config.default_guidance
    return ParityFamily(
        model="wan2.2-ti2v-5b",
        variant=variant,
        spec=Wan22Spec(config),
        request={"prompt": PROMPT, "width": width, "height": height, "num_frames": num_frames, "seed": SEED},
        cases=[ParityCase("1 step", 1, 1.0), ParityCase(f"{steps} steps", steps, guidance)],
        write_folder=partial(write_wan_folder, config),
        load_reference=load_wan_pipeline,
        encode_reference=partial(wan_prompt_embeds, max_sequence_length=config.max_text_tokens),
        run_reference=partial(run_wan, image=image, max_sequence_length=config.max_text_tokens),
        input_image=image,
        text_diagnostics=partial(wan_text_diagnostics, max_sequence_length=config.max_text_tokens),
        notes=["without ftfy installed WanPipeline cleans prompts as we do (HTML unescape, spaces)"],
    )


def write_wan_folder(config: Any, folder: Path, device: str, seed: int) -> None:
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from mstar.bench.parity_tokenizers import umt5_tokenizer
    from mstar.models.checkpoint import randomize_
    from mstar.models.wan22.config import WAN22_SCHEDULER_CONFIG

    dtype = device_dtype(device)
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = cast_like_pretrained(
            randomize_(WanTransformer3DModel(**config.dit.to_dict()), seed), dtype
        )
        vae = randomize_(AutoencoderKLWan(**config.vae), seed + 1)  # float32, as the checkpoint's
        known = set(UMT5Config().to_dict())
        umt5 = UMT5Config(**{k: v for k, v in config.text_encoder.items() if k in known})
        text_encoder = UMT5EncoderModel._from_config(umt5, dtype=dtype)  # transformers' own init
    pipe = WanPipeline(
        tokenizer=umt5_tokenizer(config.text_encoder["vocab_size"], config.max_text_tokens),
        text_encoder=text_encoder.eval(), transformer=transformer.eval(), vae=vae.eval(),
        scheduler=UniPCMultistepScheduler.from_config(WAN22_SCHEDULER_CONFIG), expand_timesteps=True,
    )  # fmt: skip
    pipe.save_pretrained(str(folder))
    del pipe, transformer, vae, text_encoder
    free_device_memory(device)


def load_wan_pipeline(folder: Path, device: str) -> Any:
    """As diffusers' examples load Wan: the VAE in float32, the rest in bf16 (float32 on CPU)."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = AutoencoderKLWan.from_pretrained(str(folder), subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(str(folder), vae=vae, torch_dtype=device_dtype(device)).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def wan_prompt_embeds(pipe: Any, prompt: str, max_sequence_length: int) -> Any:
    """The pipeline's embedding of one prompt (padded to max_sequence_length, masked), real rows."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    padded = pipe._get_t5_prompt_embeds(prompt, max_sequence_length=max_sequence_length)[0]
    mask = pipe.tokenizer(
        [prompt_clean(prompt)], padding="max_length", max_length=max_sequence_length, truncation=True,
        add_special_tokens=True, return_attention_mask=True, return_tensors="pt",
    ).attention_mask  # fmt: skip
    return padded[: int(mask.sum())]


def wan_text_diagnostics(pipe: Any, nodes: dict[str, Any], prompt: str, max_sequence_length: int):
    """Our UMT5 padded to the pipeline's max_sequence_length (same shapes as the pipeline: a
    remaining difference is then not the padding), and unpadded without a mask."""
    import torch

    from mstar.bench.parity import rel_err
    from mstar.engine.transfer import to_device

    encoder = nodes["text_encoder"].pipeline.text_encoder
    theirs = wan_prompt_embeds(pipe, prompt, max_sequence_length)
    embeds = to_device(encoder.model.shared(encoder.tokenize(prompt)), encoder.device)  # [1, L, d]
    at_max = encoder.hidden.run_padded(embeds, max_sequence_length)[0]
    unpadded = encoder._last_hidden(
        embeds, torch.ones(embeds.shape[:2], dtype=torch.bool, device=embeds.device)
    )
    return [
        (f"ours padded to {max_sequence_length} (eager)", rel_err(at_max, theirs)),
        ("ours unpadded, no mask", rel_err(unpadded[0], theirs)),
    ]


def run_wan(pipe: Any, fields: dict[str, Any], output_type: str, image: Any, max_sequence_length: int):
    """WanPipeline, or with `image` WanImageToVideoPipeline on the same components; the first output."""
    kwargs = dict(
        height=fields["height"], width=fields["width"], num_frames=fields["num_frames"],
        num_inference_steps=fields["num_inference_steps"], guidance_scale=fields["guidance_scale"],
        generator=seeded_generator(fields), output_type=output_type, max_sequence_length=max_sequence_length,
        return_dict=False,
    )  # fmt: skip
    if image is None:
        return pipe(prompt=fields["prompt"], negative_prompt=fields.get("negative_prompt"), **kwargs)[0]
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    i2v = WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=pipe.scheduler,
        transformer=pipe.transformer, expand_timesteps=True,
    )  # fmt: skip
    i2v.set_progress_bar_config(disable=True)
    # The i2v module cleans prompts with ftfy (which may be absent): the t2v pipeline encodes them.
    embeds, negative = pipe.encode_prompt(
        fields["prompt"], fields.get("negative_prompt"), fields["guidance_scale"] > 1.0,
        max_sequence_length=max_sequence_length,
    )  # fmt: skip
    return i2v(image=Image.fromarray(image), prompt_embeds=embeds, negative_prompt_embeds=negative, **kwargs)[
        0
    ]
