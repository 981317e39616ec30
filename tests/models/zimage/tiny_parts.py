"""Tiny Z-Image components built with diffusers/transformers (the parity reference) and saved in
the diffusers folder layout, plus a tiny byte-level Qwen tokenizer with a chat template
(mstar.bench.parity_tokenizers)."""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.bench.parity_tokenizers import qwen_tokenizer
from mstar.models.zimage.config import TINY, to_json_dict
from mstar.models.zimage.model import ZImageSpec


def tiny_tokenizer():
    return qwen_tokenizer()


def _randomize(module: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Non-trivial weights everywhere (diffusers zero-inits some layers, which would hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def tiny_transformer(seed: int = 0):
    from diffusers import ZImageTransformer2DModel

    model = ZImageTransformer2DModel(**to_json_dict(TINY.dit)).eval()
    _randomize(model, seed)
    return model


def tiny_vae(seed: int = 1):
    from diffusers import AutoencoderKL

    vae = TINY.vae
    num_blocks = len(vae.block_out_channels)
    model = AutoencoderKL(
        in_channels=3,
        out_channels=vae.out_channels,
        down_block_types=["DownEncoderBlock2D"] * num_blocks,
        up_block_types=["UpDecoderBlock2D"] * num_blocks,
        block_out_channels=list(vae.block_out_channels),
        layers_per_block=vae.layers_per_block,
        latent_channels=vae.latent_channels,
        norm_num_groups=vae.norm_num_groups,
        scaling_factor=vae.scaling_factor,
        shift_factor=vae.shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=vae.use_post_quant_conv,
        mid_block_add_attention=vae.mid_block_add_attention,
    ).eval()
    _randomize(model, seed, scale=0.1)
    return model


def tiny_text_encoder(seed: int = 2):
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    return Qwen3Model(Qwen3Config(**TINY.text_encoder)).eval()


def tiny_pipeline():
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline

    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False
    )
    return ZImagePipeline(
        scheduler=scheduler,
        vae=tiny_vae(),
        text_encoder=tiny_text_encoder(),
        tokenizer=tiny_tokenizer(),
        transformer=tiny_transformer(),
    )


def save_tiny_pipeline(folder: Path):
    """The tiny pipeline written with save_pretrained (diffusers folder layout); returns it too."""
    pipe = tiny_pipeline()
    pipe.save_pretrained(str(folder))
    return pipe


class TinyZImageSpec(ZImageSpec):
    """z-image-turbo at the tiny test sizes (runtime workers resolve it by "module:Class")."""

    def __init__(self):
        super().__init__(TINY)


TINY_SPEC_PATH = f"{__name__}:TinyZImageSpec"
