"""LTX-2's parity hook (its bench entry's `parity`) and the diffusers side of its benchmarks:
LTX2Pipeline (t2v) / LTX2ImageToVideoPipeline (i2v) written with random weights by save_pretrained,
loaded back and run beside our nodes by mstar.bench.parity; `diffusers_components` builds the same
pipeline in memory without a text encoder for the end-to-end baseline.

At full size (`folder_config`) the DiT, connectors, VAEs and vocoder are the released ones but for
the connectors' input projection: the folder's Gemma 3 has the 12B's width (3840, the caption width
of the connectors and the DiT) and 2 of its 48 layers, so that projection takes 3 stacked hidden
states instead of 49. The whole 12B would bring the folder (the 19B DiT alone is 38 GB) to about
66 GB, more than a 64 GiB disk holds; this one is about 45 GB.
"""

from __future__ import annotations

from dataclasses import replace
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

FOLDER_GEMMA_LAYERS = 2  # of the 12B's 48: one sliding-window and one full-attention layer
FOLDER_GEMMA_LAYER_TYPES = ("sliding_attention", "full_attention")


def ltx2_parity(variant: str | None = None, tiny: bool = False) -> ParityFamily:
    from mstar.models.ltx2.model import LTX2Spec

    variant = variant or "t2v"
    if variant not in ("t2v", "i2v"):
        raise ValueError(f"ltx-2: variant must be t2v or i2v, got '{variant}'")
    config = folder_config(tiny)
    d = config.defaults
    width, height, num_frames = (64, 64, 9) if tiny else (768, 512, 121)
    image = seeded_image(height, width, SEED) if variant == "i2v" else None
    return ParityFamily(
        model="ltx-2",
        variant=variant,
        spec=LTX2Spec(config),
        request={"prompt": PROMPT, "width": width, "height": height, "num_frames": num_frames,
                 "fps": round(d.frame_rate), "seed": SEED},
        cases=[ParityCase("2 steps", 2, d.guidance_scale), ParityCase(f"{d.num_inference_steps} steps",
               d.num_inference_steps, d.guidance_scale)],
        write_folder=partial(write_ltx2_folder, config),
        load_reference=load_ltx2_pipeline,
        encode_reference=partial(ltx2_prompt_embeds, max_sequence_length=d.max_sequence_length),
        run_reference=partial(run_ltx2, image=image, max_sequence_length=d.max_sequence_length),
        input_image=image,
        notes=["at full size the folder's Gemma 3 has 2 layers of the 12B's width (disk); guidance at LTX2Pipeline's defaults"],
    )  # fmt: skip


def folder_config(tiny: bool = False) -> Any:
    """The config a folder is written with: TINY, or the released LTX-2 with a 2-layer Gemma 3 of
    the 12B's width (its vision tower TINY's: the prompt path never runs it)."""
    import copy

    from mstar.models.ltx2.presets import LTX2, TINY

    if tiny:
        return TINY
    gemma = copy.deepcopy(LTX2.text_encoder)
    gemma["text_config"] |= {
        "num_hidden_layers": FOLDER_GEMMA_LAYERS,
        "layer_types": list(FOLDER_GEMMA_LAYER_TYPES),
    }
    gemma["vision_config"] = copy.deepcopy(TINY.text_encoder["vision_config"])
    gemma["mm_tokens_per_image"] = TINY.text_encoder["mm_tokens_per_image"]
    connectors = replace(LTX2.connectors, text_proj_in_factor=FOLDER_GEMMA_LAYERS + 1)  # embeddings + layers
    return replace(LTX2, text_encoder=gemma, connectors=connectors)


def _components(config: Any, device: str, seed: int, dtype: Any) -> dict[str, Any]:
    import torch
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from mstar.models.checkpoint import randomize_
    from mstar.models.ltx2.config import to_json_dict

    torch.manual_seed(seed)
    with torch.device(device):
        parts = {
            "transformer": LTX2VideoTransformer3DModel(**to_json_dict(config.dit)),
            "connectors": LTX2TextConnectors(**to_json_dict(config.connectors)),
            "vae": AutoencoderKLLTX2Video(**to_json_dict(config.vae)),
            "audio_vae": AutoencoderKLLTX2Audio(**to_json_dict(config.audio_vae)),
            "vocoder": LTX2Vocoder(**to_json_dict(config.vocoder)),
        }
    parts = {
        name: cast_like_pretrained(randomize_(m, seed + i), dtype).eval()
        for i, (name, m) in enumerate(parts.items())
    }
    s = config.scheduler
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=s.num_train_timesteps, shift=s.shift, use_dynamic_shifting=s.use_dynamic_shifting,
        base_shift=s.base_shift, max_shift=s.max_shift, base_image_seq_len=s.base_image_seq_len,
        max_image_seq_len=s.max_image_seq_len, shift_terminal=s.shift_terminal,
    )  # fmt: skip
    return parts


def diffusers_components(config: Any, device: str, seed: int, dtype: Any) -> Any:
    """LTX2Pipeline in memory with no text encoder or tokenizer (Gemma's hidden states passed in)."""
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline(text_encoder=None, tokenizer=None, **_components(config, device, seed, dtype))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def write_ltx2_folder(config: Any, folder: Path, device: str, seed: int) -> None:
    import copy

    import torch
    from diffusers import LTX2Pipeline
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from mstar.bench.parity_tokenizers import gemma_tokenizer
    from mstar.models.checkpoint import randomize_

    dtype = device_dtype(device)
    parts = _components(config, device, seed, dtype)
    tokenizer = gemma_tokenizer(config.defaults.max_sequence_length)
    gemma_config = copy.deepcopy(config.text_encoder)
    text = gemma_config.setdefault("text_config", {})
    text["vocab_size"] = max(text.get("vocab_size", 0), len(tokenizer))  # every token has a row
    with torch.device(device):
        gemma = Gemma3ForConditionalGeneration._from_config(Gemma3Config(**gemma_config))
    gemma = randomize_(gemma, seed + 9).to(dtype).eval()
    pipe = LTX2Pipeline(text_encoder=gemma, tokenizer=tokenizer, **parts)
    pipe.save_pretrained(str(folder))
    del pipe, parts, gemma
    free_device_memory(device)


def load_ltx2_pipeline(folder: Path, device: str) -> Any:
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(folder), torch_dtype=device_dtype(device)).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ltx2_prompt_embeds(pipe: Any, prompt: str, max_sequence_length: int) -> Any:
    """The pipeline's text for the DiT: Gemma's stacked states through its connectors, [L, Dv + Da]."""
    import torch

    embeds, mask, _, _ = pipe.encode_prompt(
        prompt, do_classifier_free_guidance=False, max_sequence_length=max_sequence_length, device=pipe.device
    )
    video, audio, _ = pipe.connectors(embeds, mask)
    return torch.cat([video, audio], dim=-1)[0]


def run_ltx2(pipe: Any, fields: dict[str, Any], output_type: str, image: Any, max_sequence_length: int):
    """The pipeline's first output: normalised video latents [C, F', H', W'] ("latent", as our loop
    leaves them) or frames [F, H, W, 3] in [0, 1] ("np")."""
    extra = {}
    if image is not None:  # the image-to-video pipeline on the same components
        from diffusers import LTX2ImageToVideoPipeline
        from PIL import Image

        pipe = LTX2ImageToVideoPipeline(**pipe.components)
        pipe.set_progress_bar_config(disable=True)
        extra["image"] = Image.fromarray(image)
    video, _ = pipe(
        prompt=fields["prompt"], negative_prompt=fields.get("negative_prompt") or "", height=fields["height"],
        width=fields["width"], num_frames=fields["num_frames"], frame_rate=float(fields["fps"]),
        num_inference_steps=fields["num_inference_steps"], guidance_scale=fields["guidance_scale"],
        generator=seeded_generator(fields), output_type=output_type, max_sequence_length=max_sequence_length,
        return_dict=False, **extra,
    )  # fmt: skip
    if output_type != "latent":
        return video[0]
    vae = pipe.vae
    shape = (1, -1, 1, 1, 1)
    mean, std = vae.latents_mean.view(shape).to(video), vae.latents_std.view(shape).to(video)
    return ((video - mean) * vae.config.scaling_factor / std)[0]
