"""A deterministic tokenizer for --random-weights runs where no tokenizer is on disk (no downloads).

It maps UTF-8 bytes to ids (offset past the special ids, folded into the vocabulary) and appends
EOS, and is called like a Hugging Face tokenizer for the arguments our text encoders use:

    tokenizer = fallback_tokenizer(vocab_size=256384)
    batch = tokenizer(["a cat"], padding="max_length", max_length=512, truncation=True, return_tensors="pt")
    batch.input_ids, batch.attention_mask      # [1, 512] int64 each

The same text always gives the same ids, so random-weight benchmarks are reproducible. It carries
no chat template (`chat_template` is None).
"""

from __future__ import annotations

from typing import Any

PAD_ID = 0
EOS_ID = 1
NUM_SPECIAL_IDS = 2


class TokenBatch(dict):
    """dict with attribute access (input_ids, attention_mask), like transformers' BatchEncoding."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as error:
            raise AttributeError(name) from error


class FallbackTokenizer:
    def __init__(self, vocab_size: int, model_max_length: int = 512, add_eos: bool = True):
        if vocab_size <= NUM_SPECIAL_IDS:
            raise ValueError(f"vocab_size must exceed {NUM_SPECIAL_IDS}, got {vocab_size}")
        self.vocab_size = vocab_size
        self.model_max_length = model_max_length
        self.add_eos = add_eos
        self.pad_token_id = PAD_ID
        self.eos_token_id = EOS_ID
        self.padding_side = "right"
        self.chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        span = self.vocab_size - NUM_SPECIAL_IDS
        ids = [NUM_SPECIAL_IDS + (byte % span) for byte in text.encode("utf-8")]
        if add_special_tokens and self.add_eos:
            ids.append(EOS_ID)
        return ids

    def __call__(
        self,
        text: str | list[str],
        padding: bool | str = False,
        max_length: int | None = None,
        truncation: bool = False,
        add_special_tokens: bool = True,
        return_attention_mask: bool = True,
        return_tensors: str | None = None,
        **_: Any,
    ) -> TokenBatch:
        texts = [text] if isinstance(text, str) else list(text)
        limit = max_length if max_length is not None else self.model_max_length
        rows = [self._truncated(self.encode(t, add_special_tokens), limit, truncation) for t in texts]
        width = self._padded_width(rows, padding, limit)
        input_ids = [self._pad(row, width, self.pad_token_id) for row in rows]
        masks = [self._pad([1] * len(row), width, 0) for row in rows]
        batch = TokenBatch(input_ids=input_ids)
        if return_attention_mask:
            batch["attention_mask"] = masks
        if return_tensors == "pt":
            import torch

            batch = TokenBatch({k: torch.tensor(v, dtype=torch.int64) for k, v in batch.items()})
        elif return_tensors is not None:
            raise ValueError(f"return_tensors='{return_tensors}' is not supported (use 'pt' or None)")
        if isinstance(text, str) and return_tensors is None:
            batch = TokenBatch({k: v[0] for k, v in batch.items()})
        return batch

    def _truncated(self, ids: list[int], limit: int, truncation: bool) -> list[int]:
        if not truncation or len(ids) <= limit:
            return ids
        if self.add_eos and ids[-1] == EOS_ID:
            return [*ids[: limit - 1], EOS_ID]  # keep EOS last, as T5 tokenizers do
        return ids[:limit]

    @staticmethod
    def _padded_width(rows: list[list[int]], padding: bool | str, limit: int) -> int | None:
        if padding == "max_length":
            return limit
        if padding in (True, "longest"):
            return max(len(row) for row in rows)
        return None

    def _pad(self, row: list[int], width: int | None, value: int) -> list[int]:
        if width is None or len(row) >= width:
            return row
        pad = [value] * (width - len(row))
        return row + pad if self.padding_side == "right" else pad + row


def fallback_tokenizer(vocab_size: int, model_max_length: int = 512) -> FallbackTokenizer:
    return FallbackTokenizer(vocab_size=vocab_size, model_max_length=model_max_length)


def load_tokenizer(folder: str | None, vocab_size: int, max_length: int, add_eos: bool = True) -> Any:
    """A checkpoint's tokenizer/ folder (transformers' AutoTokenizer), else the deterministic
    fallback (random weights: nothing on disk, no downloads). `add_eos`: whether the fallback ends
    a text with EOS as T5 tokenizers do (Qwen's adds no special tokens)."""
    from pathlib import Path

    if folder is not None and Path(folder).is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    return FallbackTokenizer(vocab_size, max_length, add_eos=add_eos)
