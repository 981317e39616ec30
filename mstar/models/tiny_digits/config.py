"""Sizes of the tiny digits model. Plain Python (no torch): the spec reads these at import.

The DiT is the Wan2.2 DiT (mstar.models.wan22.dit) at a toy size; images are one-frame videos in
pixel space (no VAE): [channels=1, frames=1, IMAGE_SIZE, IMAGE_SIZE], values in [-1, 1], ink = +1.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

WEIGHTS_DIR = Path(__file__).parent / "weights"
CONFIG_FILE = "config.json"
DIT_FILE = "transformer.safetensors"
TEXT_ENCODER_FILE = "text_encoder.safetensors"
VOCAB_FILE = "vocab.json"

IMAGE_SIZE = 16  # pixels per side the DiT works at
NUM_CHANNELS = 1
OUTPUT_SIZE = 256  # pixels per side of the served image (upscaled from IMAGE_SIZE)
MAX_TEXT_TOKENS = 16  # prompt words kept after <bos>; longer prompts are truncated


def default_dit_config() -> dict:
    """Keyword arguments of the Wan DiT, named as diffusers' WanTransformer3DModel config."""
    return {
        "patch_size": [1, 4, 4],
        "num_attention_heads": 2,
        "attention_head_dim": 64,
        "in_channels": NUM_CHANNELS,
        "out_channels": NUM_CHANNELS,
        "text_dim": 32,
        "freq_dim": 64,
        "ffn_dim": 256,
        "num_layers": 3,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
        "image_dim": None,
        "added_kv_proj_dim": None,
        "rope_max_seq_len": 64,
    }


@dataclass
class TinyDigitsConfig:
    """What weights/config.json holds: enough to rebuild every node."""

    image_size: int = IMAGE_SIZE
    num_channels: int = NUM_CHANNELS
    output_size: int = OUTPUT_SIZE
    max_text_tokens: int = MAX_TEXT_TOKENS
    text_dim: int = 32
    sampler_shift: float = 1.0  # flow-match sigma shift used in training and sampling
    default_steps: int = 20
    default_guidance_scale: float = 3.5
    dit: dict = field(default_factory=default_dit_config)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> TinyDigitsConfig:
        return cls(**json.loads(path.read_text()))
