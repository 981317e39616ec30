"""Cosmos3 sizes, token counts, guidance labels and step cost: plain arithmetic, no torch.

One request is one prompt per guidance label (its understanding prefix: the prompt's text tokens)
and one latent video; each denoise step runs the generation pathway over the latent's vision
tokens, whose queries attend to the label's prefix plus the vision tokens themselves.

    shape = latent_shape(config.vae, num_frames=121, height=480, width=832)   # (48, 31, 30, 52)
    grid = patch_grid(shape, config.transformer.latent_patch_size)            # (31, 15, 26)
    labels = guidance_labels(6.0)                                             # ("cond", "uncond")
    flops = generation_flops(config.transformer, num_vision_tokens(grid), num_prefix_tokens=300)
"""

from __future__ import annotations

import math

from mstar.models.cosmos3.config import Cosmos3TransformerConfig
from mstar.models.wan22.vae_config import WanVAEConfig

# The denoise loop's labels (mstar.diffusion.denoise COND / UNCOND).
COND, UNCOND = "cond", "uncond"
# Tokens after the chat-formatted prompt: the tokenizer's end of text, then <|vision_start|>.
NUM_PROMPT_SUFFIX_TOKENS = 2
# The latent frames image-to-video keeps clean (the encoded input image).
IMAGE_CONDITION_FRAMES = (0,)


def latent_shape(vae: WanVAEConfig, num_frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """[C, F', H', W'] latents of the Wan2.2 z48 VAE (16x spatial, 4x temporal) for one request."""
    return vae.latent_shape(num_frames, height, width)


def patch_grid(latent: tuple[int, ...], patch: int) -> tuple[int, int, int]:
    """(frames, height, width) in patches of a [C, F', H', W'] latent; odd sides are zero-padded."""
    _, frames, height, width = latent
    return frames, math.ceil(height / patch), math.ceil(width / patch)


def num_vision_tokens(grid: tuple[int, int, int]) -> int:
    return grid[0] * grid[1] * grid[2]


def num_noisy_tokens(grid: tuple[int, int, int], clean_frames: tuple[int, ...] = ()) -> int:
    """Vision tokens the generation pathway predicts (clean conditioning frames get no output)."""
    kept = {frame for frame in clean_frames if 0 <= frame < grid[0]}
    return (grid[0] - len(kept)) * grid[1] * grid[2]


def guidance_labels(guidance_scale: float) -> tuple[str, ...]:
    """The labels a request runs: both unless the scale is exactly 1 (diffusers' rule)."""
    return (COND,) if guidance_scale == 1.0 else (COND, UNCOND)


def vision_temporal_offset(num_prefix_tokens: int, config: Cosmos3TransformerConfig) -> int:
    """First temporal mRoPE position of the vision tokens: after the text, past a fixed margin."""
    return num_prefix_tokens + config.unified_3d_mrope_temporal_modality_margin


def fps_modulated(config: Cosmos3TransformerConfig, num_latent_frames: int) -> bool:
    """Temporal positions scale with fps (base_fps 24 is unscaled) for videos, not for images."""
    return config.enable_fps_modulation and num_latent_frames > 1


TIMESTEP_CHANNELS = 256  # the sinusoidal timestep features the time embedder reads


def _linear_flops(tokens: int, *shapes: tuple[int, int]) -> int:
    return sum(2 * tokens * fan_in * fan_out for fan_in, fan_out in shapes)


def _projection_flops(config: Cosmos3TransformerConfig, tokens: int, with_queries: bool = True) -> int:
    """Q (optional), K, V and O projections of one pathway of one layer over `tokens` rows."""
    hidden, q_dim = config.hidden_size, config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    if not with_queries:
        return _linear_flops(tokens, (hidden, kv_dim), (hidden, kv_dim))
    return _linear_flops(tokens, (hidden, q_dim), (hidden, kv_dim), (hidden, kv_dim), (q_dim, hidden))


def _mlp_flops(config: Cosmos3TransformerConfig, tokens: int) -> int:
    num_in = 2 if config.hidden_act == "silu" else 1  # gate and up, or up alone
    hidden, inner = config.hidden_size, config.intermediate_size
    return _linear_flops(tokens, *[(hidden, inner)] * num_in) + _linear_flops(tokens, (inner, hidden))


def attention_flops(config: Cosmos3TransformerConfig, num_queries: int, num_keys: float) -> int:
    """Scores and weighted values of `num_queries` queries over `num_keys` keys each, one layer."""
    return int(2 * 2 * num_queries * num_keys * config.num_attention_heads * config.head_dim)


def generation_flops(config: Cosmos3TransformerConfig, num_vision_tokens: int, num_prefix_tokens: int) -> int:
    """FLOPs of one generation-pathway forward of one (request, label): every matmul (the
    counted-FLOP roofline's numerator; norms, rotary and elementwise work are left out)."""
    per_layer = (
        _projection_flops(config, num_vision_tokens)
        + _mlp_flops(config, num_vision_tokens)
        + attention_flops(config, num_vision_tokens, num_prefix_tokens + num_vision_tokens)
    )
    hidden, patch = config.hidden_size, config.patch_latent_dim
    heads = _linear_flops(num_vision_tokens, (patch, hidden), (hidden, patch))
    timestep_row = _linear_flops(1, (TIMESTEP_CHANNELS, hidden), (hidden, hidden))
    return config.num_hidden_layers * per_layer + heads + timestep_row


def understanding_flops(config: Cosmos3TransformerConfig, num_prefix_tokens: int) -> int:
    """FLOPs of one understanding prefill (once per request and label). Causal attention reads
    (L + 1) / 2 keys per query on average; the last layer stops after its keys and values."""
    tokens = num_prefix_tokens
    full_layer = (
        _projection_flops(config, tokens)
        + _mlp_flops(config, tokens)
        + attention_flops(config, tokens, (tokens + 1) / 2)
    )
    last_layer = _projection_flops(config, tokens, with_queries=False)
    return (config.num_hidden_layers - 1) * full_layer + last_layer


def step_flops(config: Cosmos3TransformerConfig, num_vision_tokens: int, prefix_lens: tuple[int, ...]) -> int:
    """One denoise step of one request: a generation forward per label (its prefix lengths)."""
    return sum(generation_flops(config, num_vision_tokens, length) for length in prefix_lens)


class Cosmos3Geometry:
    """The spec's geometry (what the scaffold asks of every family): the guidance rule."""

    @staticmethod
    def labels(guidance_scale: float) -> tuple[str, ...]:
        return guidance_labels(guidance_scale)
