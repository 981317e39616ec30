"""The parity harness's family hooks: one function per family builds its ParityFamily (the reference
pipeline written with random weights, loaded back, run, and its prompt embeddings).

Random weights: the DiT and the VAE get random_weights' rule on every tensor (diffusers' own init
leaves layers at zero, which would hide bugs); the text encoders keep transformers' own init.
UMT5's (Mesh TensorFlow's) folds 1/sqrt(d_kv) into the query projection as the trained weights do;
with every matrix at N(0, 1/fan_in) instead, UMT5-XXL's attention logits are 8x too large and the
encoder is chaotic (on the CPU, 6 full-width layers turn a 1e-3 input change into 1e-1), so any
rounding difference between two correct implementations grows to O(1) over its 24 layers.

The tiny variants (`tiny=True`) use the test configs: the same code runs end to end on a CPU.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from mstar.bench.parity import ParityCase, ParityFamily

PROMPT = "a tiny red fox runs through fresh snow at dawn, cinematic shot, soft light, detailed fur"
SEED = 77


def _dtype(device: str):
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def _generator(fields: dict[str, Any]):
    import torch

    return torch.Generator("cpu").manual_seed(int(fields["seed"]))


def _cast(model: Any, dtype: Any) -> Any:
    """To `dtype` but its _keep_in_fp32_modules, as from_pretrained(torch_dtype=...) leaves it."""
    from mstar.bench.ours import cast_parameters

    return cast_parameters(model, dtype, getattr(model, "_keep_in_fp32_modules", None))


def _seeded_image(height: int, width: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


# Wan2.2-TI2V-5B: WanPipeline (t2v), WanImageToVideoPipeline with expand_timesteps (i2v).


def wan_parity(variant: str | None = None, tiny: bool = False) -> ParityFamily:
    from mstar.models.wan22.config import Wan22Config, tiny_wan22_config
    from mstar.models.wan22.model import Wan22Spec

    variant = variant or "t2v"
    if variant not in ("t2v", "i2v"):
        raise ValueError(f"wan2.2-ti2v-5b: variant must be t2v or i2v, got '{variant}'")
    config = tiny_wan22_config() if tiny else Wan22Config()
    width, height, num_frames = (32, 32, 5) if tiny else (832, 480, 33)
    image = _seeded_image(height, width, SEED) if variant == "i2v" else None
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

    dtype = _dtype(device)
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = _cast(randomize_(WanTransformer3DModel(**config.dit.to_dict()), seed), dtype)
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
    _free_device_memory(device)


def load_wan_pipeline(folder: Path, device: str) -> Any:
    """As diffusers' examples load Wan: the VAE in float32, the rest in bf16 (float32 on CPU)."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline

    vae = AutoencoderKLWan.from_pretrained(str(folder), subfolder="vae", torch_dtype=torch.float32)
    pipe = WanPipeline.from_pretrained(str(folder), vae=vae, torch_dtype=_dtype(device)).to(device)
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

    encoder = nodes["text_encoder"].encoder
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
        generator=_generator(fields), output_type=output_type, max_sequence_length=max_sequence_length,
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


# Z-Image-Turbo: ZImagePipeline.


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


def zimage_vae_kwargs(vae: Any) -> dict[str, Any]:
    """diffusers AutoencoderKL kwargs of our VAEConfig (the Flux-style VAE, no quant conv)."""
    num_blocks = len(vae.block_out_channels)
    return dict(
        in_channels=3, out_channels=vae.out_channels, latent_channels=vae.latent_channels,
        down_block_types=["DownEncoderBlock2D"] * num_blocks, up_block_types=["UpDecoderBlock2D"] * num_blocks,
        block_out_channels=list(vae.block_out_channels), layers_per_block=vae.layers_per_block,
        norm_num_groups=vae.norm_num_groups, scaling_factor=vae.scaling_factor, shift_factor=vae.shift_factor,
        use_quant_conv=False, use_post_quant_conv=vae.use_post_quant_conv,
        mid_block_add_attention=vae.mid_block_add_attention,
    )  # fmt: skip


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

    dtype = _dtype(device)
    torch.manual_seed(seed)
    with torch.device(device):
        transformer = _cast(randomize_(ZImageTransformer2DModel(**to_json_dict(config.dit)), seed), dtype)
        vae = randomize_(AutoencoderKL(**zimage_vae_kwargs(config.vae)), seed + 1).to(dtype)
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
    _free_device_memory(device)


def load_zimage_pipeline(folder: Path, device: str) -> Any:
    from diffusers import ZImagePipeline

    pipe = ZImagePipeline.from_pretrained(str(folder), torch_dtype=_dtype(device)).to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def zimage_prompt_embeds(pipe: Any, prompt: str, max_sequence_length: int) -> Any:
    return pipe._encode_prompt(prompt, max_sequence_length=max_sequence_length)[0]


def run_zimage(pipe: Any, fields: dict[str, Any], output_type: str, max_sequence_length: int):
    return pipe(
        fields["prompt"], negative_prompt=fields.get("negative_prompt"), height=fields["height"],
        width=fields["width"], num_inference_steps=fields["num_inference_steps"],
        guidance_scale=fields["guidance_scale"], generator=_generator(fields), output_type=output_type,
        max_sequence_length=max_sequence_length, return_dict=False,
    )[0]  # fmt: skip


def _free_device_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


FAMILIES = {"wan2.2-ti2v-5b": wan_parity, "z-image-turbo": zimage_parity}


def parity_family(model: str, variant: str | None = None, tiny: bool = False) -> ParityFamily:
    """The family's hook for a registered model name; `variant` None is the family's first."""
    if model not in FAMILIES:
        raise ValueError(f"no parity hook for '{model}' (have: {', '.join(sorted(FAMILIES))})")
    return FAMILIES[model](variant, tiny=tiny)
