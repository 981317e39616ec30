"""Tiny LTX-2 components built with diffusers/transformers (the parity reference) at the sizes of
mstar.models.ltx2.config.TINY, a tiny Gemma 3 with a real Gemma tokenizer built offline, and the
whole LTX2Pipeline written with save_pretrained (the diffusers folder layout our loaders read)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import torch

from mstar.models.ltx2.config import DiTConfig, LTX2Config, to_json_dict
from mstar.models.ltx2.presets import TINY

# LTX-2.3's switches on the tiny DiT: gated attention, cross-attention modulation (timestep-dependent
# text modulation), perturbed attention for spatio-temporal guidance, no caption projection, no
# feed-forward biases, interleaved rotary.
TINY_DIT_23 = replace(
    TINY.dit,
    gated_attn=True,
    audio_gated_attn=True,
    cross_attn_mod=True,
    audio_cross_attn_mod=True,
    perturbed_attn=True,
    use_prompt_embeddings=False,
    ff_bias=False,
    rope_type="interleaved",
    rope_double_precision=False,
)
# LTX-2.5's static (timestep-free) text modulation.
TINY_DIT_25 = replace(
    TINY_DIT_23, use_prompt_adaln_single=False, use_keyframes_abs_pos_embedding=True, rope_type="split"
)

GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
GEMMA_WORDS = ("▁a", "▁the", "▁cat", "▁dog", "▁robot", "▁dancing", "▁in", "▁rain", "▁sings")


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.2) -> None:
    """Non-trivial weights everywhere (diffusers zero-inits some layers, which would hide bugs)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def tiny_transformer(config: DiTConfig = TINY.dit, seed: int = 0):
    from diffusers import LTX2VideoTransformer3DModel

    model = LTX2VideoTransformer3DModel(**to_json_dict(config)).eval()
    randomize(model, seed)
    return model


def tiny_connectors(config: LTX2Config = TINY, seed: int = 1):
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    model = LTX2TextConnectors(**to_json_dict(config.connectors)).eval()
    randomize(model, seed)
    return model


def tiny_video_vae(config: LTX2Config = TINY, seed: int = 2):
    from diffusers import AutoencoderKLLTX2Video

    model = AutoencoderKLLTX2Video(**to_json_dict(config.vae)).eval()
    randomize(model, seed, scale=0.1)
    with torch.no_grad():  # statistics of the right scale (random ones could be near zero)
        channels = config.vae.latent_channels
        model.latents_mean.copy_(torch.linspace(-0.3, 0.3, channels))
        model.latents_std.copy_(torch.linspace(0.5, 1.5, channels))
    return model


def tiny_audio_vae(config: LTX2Config = TINY, seed: int = 3):
    from diffusers import AutoencoderKLLTX2Audio

    model = AutoencoderKLLTX2Audio(**to_json_dict(config.audio_vae)).eval()
    randomize(model, seed, scale=0.1)
    with torch.no_grad():
        features = model.latents_mean.shape[0]
        model.latents_mean.copy_(torch.linspace(-0.2, 0.2, features))
        model.latents_std.copy_(torch.linspace(0.6, 1.4, features))
    return model


def tiny_vocoder(config: LTX2Config = TINY, seed: int = 4):
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    model = LTX2Vocoder(**to_json_dict(config.vocoder)).eval()
    randomize(model, seed, scale=0.1)
    return model


def tiny_gemma_config(config: LTX2Config = TINY):
    """The preset's two-layer Gemma 3 (its hidden size and layer count fit the tiny connectors)."""
    from transformers import Gemma3Config

    return Gemma3Config(**copy.deepcopy(config.text_encoder))


def tiny_text_encoder(config: LTX2Config = TINY, seed: int = 5):
    from transformers import Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration(tiny_gemma_config(config)).eval()
    randomize(model, seed, scale=0.1)
    return model


def tiny_tokenizer(max_length: int = TINY.defaults.max_sequence_length):
    """Gemma's tokenizer (BPE with byte fallback, "▁" for spaces, <bos> first) over a small vocab."""
    from transformers import GemmaTokenizerFast

    vocab = {token: index for index, token in enumerate(GEMMA_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in "▁abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(char, len(vocab))
    merges = []
    for word in GEMMA_WORDS:  # merge each word left to right: ▁ + c, then + a, ...
        for end in range(2, len(word) + 1):
            merges.append((word[: end - 1], word[end - 1]))
            vocab.setdefault(word[:end], len(vocab))
    tokenizer = GemmaTokenizerFast(vocab=vocab, merges=merges, add_bos_token=True)
    tokenizer.model_max_length = max_length
    return tokenizer


def tiny_scheduler(config: LTX2Config = TINY):
    from diffusers import FlowMatchEulerDiscreteScheduler

    s = config.scheduler
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=s.num_train_timesteps,
        shift=s.shift,
        use_dynamic_shifting=s.use_dynamic_shifting,
        base_shift=s.base_shift,
        max_shift=s.max_shift,
        base_image_seq_len=s.base_image_seq_len,
        max_image_seq_len=s.max_image_seq_len,
        shift_terminal=s.shift_terminal,
    )


def tiny_pipeline(config: LTX2Config = TINY, image_to_video: bool = False):
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

    pipeline_class = LTX2ImageToVideoPipeline if image_to_video else LTX2Pipeline
    return pipeline_class(
        scheduler=tiny_scheduler(config),
        vae=tiny_video_vae(config),
        audio_vae=tiny_audio_vae(config),
        text_encoder=tiny_text_encoder(config),
        tokenizer=tiny_tokenizer(config.defaults.max_sequence_length),
        connectors=tiny_connectors(config),
        transformer=tiny_transformer(config.dit),
        vocoder=tiny_vocoder(config),
    )


def save_tiny_pipeline(folder: Path, config: LTX2Config = TINY):
    """The tiny LTX2Pipeline written with save_pretrained (diffusers folder layout); returns it too."""
    pipe = tiny_pipeline(config)
    pipe.save_pretrained(str(folder))
    return pipe
