"""Z-Image's prompt encoder, Qwen3, as ZImagePipeline.encode_prompt does it:
chat template (user turn, generation prompt, thinking enabled), truncation to 512 tokens, the
second-to-last hidden state, and only the tokens the attention mask keeps."""

from __future__ import annotations

from typing import Any

import torch

from mstar.engine.cuda_graphs import DEFAULT_BUCKET_LENGTHS, GraphedByLength
from mstar.engine.transfer import to_device

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


class Qwen3PromptEncoder:
    """Qwen3Model + tokenizer -> one [num_tokens, hidden] embedding per prompt.

    The pipeline pads to 512 tokens; with a causal model the kept tokens see exactly what they see
    there, so each prompt is encoded alone, unpadded and without a mask (see `encode`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: torch.device | str,
        max_text_tokens: int = 512,
        cuda_graphs: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_text_tokens = max_text_tokens
        self.hidden = self._second_to_last_hidden
        if cuda_graphs and self.device.type == "cuda":
            # Causal: right-padding a prompt to its bucket leaves its own tokens' states unchanged.
            buckets = tuple(n for n in DEFAULT_BUCKET_LENGTHS if n < max_text_tokens)
            self.hidden = GraphedByLength(
                self._second_to_last_hidden, _pad_id(tokenizer), self.device, (*buckets, max_text_tokens)
            )

    def warmup(self) -> None:
        """Capture the CUDA graphs (one per length bucket), when they are on."""
        if isinstance(self.hidden, GraphedByLength):
            self.hidden.capture()

    def tokenize(self, prompt: str) -> torch.Tensor:
        """input_ids [1, num_tokens] of one prompt in its chat template, on the host (no padding)."""
        encoded = self.tokenizer(
            [chat_text(self.tokenizer, prompt)],
            max_length=self.max_text_tokens,
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
        input_ids = to_device(self.tokenize(prompt), self.device)  # [1, num_tokens]
        return self.hidden(input_ids)[0]  # [num_tokens, hidden]

    def _second_to_last_hidden(self, input_ids: torch.Tensor) -> torch.Tensor:
        """What Qwen3Model(output_hidden_states=True).hidden_states[-2] holds, [1, L, hidden]: the
        output of every layer but the last (which, with the final norm, is never run). No mask:
        causal attention over the whole (unpadded or right-padded) sequence."""
        model = self.model
        hidden = model.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        rope = model.rotary_emb(hidden, position_ids)
        for layer in model.layers[: len(model.layers) - 1]:
            hidden = layer(hidden, attention_mask=None, position_embeddings=rope, position_ids=position_ids)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden  # older transformers: a tuple
        return hidden


def _pad_id(tokenizer: Any) -> int:
    """The token right-padding fills with (any id would do: causal, its states are dropped)."""
    pad_id = getattr(tokenizer, "pad_token_id", None)
    return 0 if pad_id is None else int(pad_id)


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
