"""Qwen3 prompt encoder and the `text_encoder` node, as ZImagePipeline.encode_prompt does it:
chat template (user turn, generation prompt, thinking enabled), truncation to 512 tokens, the
second-to-last hidden state, and only the tokens the attention mask keeps."""

from __future__ import annotations

from typing import Any

import torch

from mstar.engine.transfer import to_device
from mstar.models.text_encoding import PromptEmbedsNode

# What Qwen3's chat template renders for one user turn with add_generation_prompt=True and
# enable_thinking=True (used when a tokenizer carries no template, e.g. the fallback tokenizer).
QWEN3_USER_TURN = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


def chat_text(tokenizer: Any, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=True
        )
    return QWEN3_USER_TURN.format(prompt=prompt)


class PromptEncoder:
    """Qwen3Model + tokenizer -> one [num_tokens, hidden] embedding per prompt.

    The pipeline pads to 512 tokens; with a causal model the kept tokens see exactly what they see
    there, so each prompt is encoded alone, unpadded and without a mask (see `encode`)."""

    def __init__(
        self, model: Any, tokenizer: Any, device: torch.device | str, max_sequence_length: int = 512
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_sequence_length = max_sequence_length

    def tokenize(self, prompt: str) -> torch.Tensor:
        """input_ids [1, num_tokens] of one prompt in its chat template, on the host (no padding)."""
        encoded = self.tokenizer(
            [chat_text(self.tokenizer, prompt)],
            max_length=self.max_sequence_length,
            truncation=True,
            return_tensors="pt",
        )
        return encoded["input_ids"]

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        """One prompt per forward: its embedding never depends on the prompts batched with it, and
        nothing reads the device back. (Given a mask, transformers checks it for padding on the
        device, and on a busy server that read waits for the DiT step queued before it: 0.5 s at
        c=4 on the H200. The encoder is launch-bound, so batching prompts saved little.)"""
        return [self._encode_one(prompt) for prompt in prompts]

    def _encode_one(self, prompt: str) -> torch.Tensor:
        input_ids = self.tokenize(prompt)  # [1, num_tokens]
        outputs = self.model(
            input_ids=to_device(input_ids, self.device), output_hidden_states=True, use_cache=False
        )
        return outputs.hidden_states[-2][0]  # [num_tokens, hidden]


def uses_guidance(params: dict[str, Any]) -> bool:
    """The pipeline runs classifier-free guidance whenever guidance_scale > 0."""
    return float(params.get("guidance_scale") or 0.0) > 0.0


class TextEncoderNode(PromptEmbedsNode):
    """The shared text_encoder node with Z-Image's guidance rule (guidance_scale > 0)."""

    def uses_guidance(self, params: dict[str, Any]) -> bool:
        return uses_guidance(params)


def build_qwen3(
    config: dict[str, Any], device: str, dtype: torch.dtype, path: str | None = None, seed: int = 0
):
    """Qwen3Model from a diffusers `text_encoder/` folder, or with seeded random weights built on the
    device from `config` (the real Qwen3-4B config for benchmarks)."""
    from transformers import Qwen3Config, Qwen3Model

    if path is not None:
        model = Qwen3Model.from_pretrained(path, dtype=dtype)
        return model.to(device).eval().requires_grad_(False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3Model._from_config(Qwen3Config(**config), dtype=dtype)
    return model.eval().requires_grad_(False)
