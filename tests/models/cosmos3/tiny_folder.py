"""Tiny Cosmos3 folders for CPU tests: diffusers' Cosmos3OmniPipeline with a tiny transformer, the
tiny Wan VAE and the family's byte-level tokenizer built offline, written with save_pretrained.

    folder = write_tiny_folder(tmp_path / "cosmos3", variant="edge")
    pipe = diffusers.Cosmos3OmniPipeline.from_pretrained(folder)   # the parity reference
    config = Cosmos3Config.from_folder(folder)                     # ours, from the same files

Two variants follow the two published backbones at toy sizes: "nano" (SiLU MLP, q/k norms on the
understanding pathway) and "edge" (ReLU^2 MLP, Nemotron norms, no text q/k norm, an understanding
key norm for the generation pathway). Head dim 16 with rope_axes_dim (4, 2, 2) interleaves all
three mRoPE axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mstar.models.cosmos3.text import offline_tokenizer
from mstar.models.wan22.config import tiny_wan22_config

TINY_VOCAB_SIZE = 264  # 256 byte symbols + the special tokens, rounded up

_COMMON: dict[str, Any] = {
    "head_dim": 16,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "latent_channel": 16,
    "latent_patch_size": 2,
    "patch_latent_dim": 64,
    "rope_axes_dim": [4, 2, 2],
    "vocab_size": TINY_VOCAB_SIZE,
}
TINY_TRANSFORMERS: dict[str, dict[str, Any]] = {
    "nano": {**_COMMON, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 5000000.0},
    "edge": {
        **_COMMON,
        "hidden_act": "relu2",
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000000.0,
        "qk_norm_for_text": False,
        "use_und_k_norm_for_gen": True,
    },
}


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Non-trivial weights everywhere (diffusers initialises norms to 1 and some layers to 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            noise = torch.randn(param.shape, generator=generator) * scale
            param.copy_(1.0 + noise if "norm" in name else noise)


def tiny_transformer(variant: str = "nano", seed: int = 0):
    from diffusers import Cosmos3OmniTransformer

    model = Cosmos3OmniTransformer(**TINY_TRANSFORMERS[variant]).eval()
    randomize(model, seed)
    return model


def tiny_vae(seed: int = 1):
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(**tiny_wan22_config().vae).eval()
    randomize(vae, seed, scale=0.1)
    return vae


def tiny_scheduler(flow_shift: float = 3.0, use_karras_sigmas: bool = False):
    from diffusers import UniPCMultistepScheduler

    extra = {"use_karras_sigmas": True, "sigma_min": 0.147, "sigma_max": 200.0} if use_karras_sigmas else {}
    return UniPCMultistepScheduler(
        num_train_timesteps=1000,
        solver_order=2,
        predict_x0=True,
        solver_type="bh2",
        lower_order_final=True,
        final_sigmas_type="zero",
        use_flow_sigmas=True,
        prediction_type="flow_prediction",
        flow_shift=flow_shift,
        **extra,
    )


def write_tiny_folder(
    folder: Path,
    variant: str = "nano",
    *,
    default_use_system_prompt: bool = True,
    use_native_flow_schedule: bool = False,
    flow_shift: float = 3.0,
    use_karras_sigmas: bool = False,
) -> Path:
    """A tiny Cosmos3OmniPipeline saved with save_pretrained (the diffusers folder layout)."""
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline(
        transformer=tiny_transformer(variant),
        text_tokenizer=offline_tokenizer(),
        vae=tiny_vae(),
        scheduler=tiny_scheduler(flow_shift, use_karras_sigmas),
        enable_safety_checker=False,
        default_use_system_prompt=default_use_system_prompt,
        use_native_flow_schedule=use_native_flow_schedule,
    )
    pipe.save_pretrained(str(folder))
    return Path(folder)


def load_reference(folder: Path):
    """diffusers' pipeline from the folder (float32, as saved), on the CPU."""
    from mstar.models.cosmos3.reference import load_pipeline

    return load_pipeline(folder)
