"""Tiny FLUX.2 [klein] components built with diffusers/transformers (the parity reference) and
saved in the diffusers folder layout, with the byte-level Qwen tokenizer of the Z-Image tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from mstar.models.flux2_klein.config import TINY, Flux2KleinConfig, to_json_dict
from mstar.models.flux2_klein.model import Flux2KleinSpec
from tests.models.zimage.tiny_parts import tiny_tokenizer

__all__ = ["TINY", "save_tiny_pipeline", "tiny_pipeline", "tiny_tokenizer", "tiny_transformer"]


def _randomize(module: torch.nn.Module, seed: int, scale: float) -> None:
    """Non-trivial weights everywhere (diffusers zero-inits some layers, which would hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def tiny_transformer(config: Flux2KleinConfig = TINY, seed: int = 0):
    from diffusers import Flux2Transformer2DModel

    model = Flux2Transformer2DModel(**to_json_dict(config.transformer)).eval()
    _randomize(model, seed, scale=0.2)
    return model


def tiny_vae(config: Flux2KleinConfig = TINY, seed: int = 1):
    from diffusers import AutoencoderKLFlux2

    vae = config.vae
    num_blocks = len(vae.block_out_channels)
    model = AutoencoderKLFlux2(
        **to_json_dict(vae),
        down_block_types=["DownEncoderBlock2D"] * num_blocks,
        up_block_types=["UpDecoderBlock2D"] * num_blocks,
    ).eval()
    _randomize(model, seed, scale=0.1)
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():  # latent statistics of a plausible scale (a variance must be positive)
        model.bn.running_mean.copy_(torch.randn(model.bn.running_mean.shape, generator=generator) * 0.3)
        model.bn.running_var.copy_(torch.rand(model.bn.running_var.shape, generator=generator) + 0.5)
    return model


def tiny_text_encoder(config: Flux2KleinConfig = TINY, seed: int = 2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(**config.text_encoder)).eval()


def tiny_scheduler(config: Flux2KleinConfig = TINY):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**dataclasses.asdict(config.scheduler))


def tiny_pipeline(is_distilled: bool, config: Flux2KleinConfig = TINY):
    from diffusers import Flux2KleinPipeline

    return Flux2KleinPipeline(
        scheduler=tiny_scheduler(config),
        vae=tiny_vae(config),
        text_encoder=tiny_text_encoder(config),
        tokenizer=tiny_tokenizer(),
        transformer=tiny_transformer(config),
        is_distilled=is_distilled,
    )


def save_tiny_pipeline(folder: Path, is_distilled: bool = True, config: Flux2KleinConfig = TINY):
    """The tiny pipeline written with save_pretrained (the diffusers folder layout); returns it too."""
    pipe = tiny_pipeline(is_distilled, config)
    pipe.save_pretrained(str(folder))
    return pipe


def pipeline_call_kwargs(config: Flux2KleinConfig = TINY) -> dict:
    """What a call of the tiny pipeline needs beyond the request: the tiny text encoder's layers
    and prompt length (the real defaults are 9/18/27 and 512)."""
    return {
        "max_sequence_length": config.max_sequence_length,
        "text_encoder_out_layers": config.text_encoder_out_layers,
    }


class TinyFlux2KleinSpec(Flux2KleinSpec):
    """flux2-klein at the tiny test sizes (the runtime's workers resolve it by "module:Class")."""

    name = "flux2-klein-4b"
    preset = TINY
    min_side = 16


class TinyFlux2KleinBaseSpec(TinyFlux2KleinSpec):
    name = "flux2-klein-base-4b"
    preset = dataclasses.replace(TINY, is_distilled=False)


TINY_SPEC_PATH = f"{__name__}:TinyFlux2KleinSpec"
TINY_BASE_SPEC_PATH = f"{__name__}:TinyFlux2KleinBaseSpec"
