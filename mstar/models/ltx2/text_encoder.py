"""LTX-2's prompt encoder: Gemma 3 (transformers, as LTX2Pipeline loads it) and our text connectors,
one prompt per forward, as LTX2Pipeline.encode_prompt + connectors do it:

    tokens     strip, left-pad to max_sequence_length (1024), truncate, <bos> first
    Gemma 3    every hidden state (embeddings and each layer's output, 49 for the 12B), stacked
    connectors -> video text [L, Dv], audio text [L, Da]

`encode(prompts)` returns one tensor [L, Dv + Da] per prompt (video features first; split with
`split_prompt_embeds`): the shape the shared prompt-embeds node and its cache hold. A prompt is
padded to the full length as the pipeline pads it (Gemma's positions start at the padding, so the
padding changes the prompt's states), and encoded alone, so its embedding never depends on the
prompts it is batched with.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from mstar.engine.transfer import to_device
from mstar.models.ltx2.connectors import LTX2TextConnectors

PADDING_SIDE = "left"  # Gemma's chat-style padding, as the pipeline sets it


def split_prompt_embeds(embeds: torch.Tensor, video_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[L, Dv + Da] -> (video text [L, Dv], audio text [L, Da])."""
    return embeds[:, :video_dim], embeds[:, video_dim:]


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Left padding, and <eos> as the pad token when the tokenizer has none (the pipeline's setup)."""
    tokenizer.padding_side = PADDING_SIDE
    if getattr(tokenizer, "pad_token", "") is None:  # the random-weight fallback pads with its own id
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class PromptEncoder:
    """Gemma 3 + tokenizer + LTX2TextConnectors -> one [L, Dv + Da] embedding per prompt.

    `gemma`: a transformers Gemma3ForConditionalGeneration (or its `.model`); only its language
    model runs (no image, no LM head). `attention`: the connectors' RaggedAttention."""

    def __init__(
        self,
        gemma: Any,
        tokenizer: Any,
        connectors: LTX2TextConnectors,
        attention: Any,
        device: torch.device | str,
        max_sequence_length: int = 1024,
    ):
        self.model = getattr(gemma, "model", gemma)
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.connectors = connectors
        self.attention = attention
        self.device = torch.device(device)
        self.max_sequence_length = max_sequence_length

    def tokenize(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask), each [1, max_sequence_length], on the host."""
        encoded = self.tokenizer(
            [prompt.strip()],
            padding="max_length",
            max_length=self.max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return encoded["input_ids"], encoded["attention_mask"]

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Gemma's per-layer hidden states of one prompt, stacked: [1, L, D, layers] (the pipeline's
        prompt_embeds before it flattens the last two dimensions)."""
        outputs = self.model(
            input_ids=to_device(input_ids, self.device),
            attention_mask=to_device(attention_mask, self.device),
            output_hidden_states=True,
        )
        return torch.stack(outputs.hidden_states, dim=-1)

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        return [self.encode_one(prompt) for prompt in prompts]

    @torch.inference_mode()
    def encode_one(self, prompt: str) -> torch.Tensor:
        input_ids, mask = self.tokenize(prompt)
        num_valid = int(mask.sum())  # on the host: the tokenizer's mask never left it
        hidden = self.hidden_states(input_ids, mask).to(self.connectors.dtype)
        video, audio = self.connectors(hidden, num_valid, self.attention, PADDING_SIDE)
        return torch.cat([video, audio], dim=-1)


def build_gemma3(
    config: dict[str, Any], device: str, dtype: torch.dtype, path: str | None = None, seed: int = 0
):
    """Gemma 3's language model from a diffusers `text_encoder/` folder, or with seeded random
    weights from `config` (the real 12B config for benchmarks). The vision tower and LM head, which
    the prompt path never runs, are dropped."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    if path is not None:
        model = Gemma3ForConditionalGeneration.from_pretrained(path, dtype=dtype)
    else:
        torch.manual_seed(seed)
        with torch.device(device):
            model = Gemma3ForConditionalGeneration._from_config(
                Gemma3Config(**copy.deepcopy(config)), dtype=dtype
            )
    language_model = model.model.language_model
    return language_model.to(device).eval().requires_grad_(False)
