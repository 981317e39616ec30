"""The Qwen3 prompt encoder as Flux2KleinPipeline reads it (the `text_encoder` node holds one).

The pipeline renders each prompt as one user turn of the chat template with a generation
prompt and thinking disabled, pads it (right, with the pad token) and truncates it to 512
tokens, runs Qwen3ForCausalLM with that attention mask and stacks the hidden states after
layers 9, 18 and 27 into [512, 3 x hidden]. The transformer attends to all 512 positions, the
padding's states included, so those are computed exactly as there: every query attends
causally to the prompt's real tokens only (the padding keys are masked), positions 0..511.

Each prompt is encoded alone, in one forward of its own (its embedding never depends on the
prompts batched with it), and the causal-and-padding mask is built on the host, so nothing reads
the device back. Only the layers up to the deepest one read are built.
"""

from __future__ import annotations

from typing import Any

import torch

from mstar.engine.transfer import to_device
from mstar.models.flux2_klein.config import MAX_SEQUENCE_LENGTH, TEXT_ENCODER_OUT_LAYERS

# What Qwen3's chat template renders for one user turn with add_generation_prompt=True and
# enable_thinking=False (for a tokenizer that carries no template).
QWEN3_USER_TURN_NO_THINKING = (
    "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def chat_text(tokenizer: Any, prompt: str) -> str:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
    return QWEN3_USER_TURN_NO_THINKING.format(prompt=prompt)


def padded_attention_mask(key_is_real: torch.Tensor) -> torch.Tensor:
    """key_is_real bool [L] -> bool [1, 1, L, L]: query i sees key j when j <= i and j is a real
    token (what transformers' causal mask with a padding mask allows; True = attend)."""
    length = key_is_real.shape[0]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (causal & key_is_real[None, :])[None, None]


class PromptEncoder:
    """Qwen3Model (its first layers at least) + tokenizer -> one [L, len(out_layers) x hidden]
    embedding per prompt, L = max_sequence_length.

    out_layers index the pipeline's `hidden_states` (0 = embeddings, k = after k layers);
    num_hidden_layers is the checkpoint's layer count: hidden_states[num_hidden_layers] is the
    final-normed last state, as transformers returns it."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: torch.device | str,
        out_layers: tuple[int, ...] = TEXT_ENCODER_OUT_LAYERS,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
        num_hidden_layers: int | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.out_layers = tuple(out_layers)
        self.max_sequence_length = max_sequence_length
        self.num_hidden_layers = len(model.layers) if num_hidden_layers is None else num_hidden_layers
        if max(self.out_layers) > len(model.layers):
            raise ValueError(
                f"hidden state {max(self.out_layers)} needs more than the {len(model.layers)} layers built"
            )

    def tokenize(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids [1, L], attention_mask [1, L]) of one prompt on the host, as the pipeline."""
        encoded = self.tokenizer(
            chat_text(self.tokenizer, prompt),
            return_tensors="pt",
            padding="max_length",
            truncation=True,
            max_length=self.max_sequence_length,
        )
        return encoded["input_ids"], encoded["attention_mask"]

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        return [self._encode_one(prompt) for prompt in prompts]

    def _encode_one(self, prompt: str) -> torch.Tensor:
        input_ids, attention_mask = self.tokenize(prompt)
        mask = padded_attention_mask(attention_mask[0].bool())
        states = self.hidden_states(to_device(input_ids, self.device), to_device(mask, self.device))
        return torch.cat(states, dim=-1)[0]  # [L, len(out_layers) * hidden]

    def hidden_states(self, input_ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        """The pipeline's hidden_states[k] for k in out_layers, each [1, L, hidden]."""
        model = self.model
        hidden = model.embed_tokens(input_ids)
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        rope = model.rotary_emb(hidden, position_ids)
        kept = {0: hidden} if 0 in self.out_layers else {}
        for index, layer in enumerate(model.layers[: max(self.out_layers)], start=1):
            hidden = layer(hidden, attention_mask=mask, position_embeddings=rope, position_ids=position_ids)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden  # older transformers: a tuple
            if index in self.out_layers:
                kept[index] = model.norm(hidden) if index == self.num_hidden_layers else hidden
        return [kept[k] for k in self.out_layers]


def build_qwen3(
    config: dict[str, Any],
    device: str,
    dtype: torch.dtype,
    path: str | None = None,
    seed: int = 0,
    out_layers: tuple[int, ...] = TEXT_ENCODER_OUT_LAYERS,
):
    """Qwen3Model with the layers up to max(out_layers), from a diffusers `text_encoder/` folder
    (a Qwen3ForCausalLM checkpoint: its `model.` weights; lm_head and deeper layers are not read)
    or with seeded random weights built on the device from `config`."""
    from transformers import Qwen3Config, Qwen3Model

    num_layers = min(max(out_layers), int(config["num_hidden_layers"]))
    overrides: dict[str, Any] = {"num_hidden_layers": num_layers}
    if config.get("layer_types"):
        overrides["layer_types"] = list(config["layer_types"])[:num_layers]
    if path is not None:
        model = Qwen3Model.from_pretrained(path, dtype=dtype, **overrides)
        return model.to(device).eval().requires_grad_(False)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3Model._from_config(Qwen3Config(**{**config, **overrides}), dtype=dtype)
    return model.eval().requires_grad_(False)
