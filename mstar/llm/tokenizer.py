"""Tokenizers of text models: the checkpoint folder's (transformers, with its chat template) or, for
--random-weights without a folder, a byte-level fallback with Qwen's chat markers.

    tokenizer = load_text_tokenizer(folder)              # or fallback_text_tokenizer(vocab_size)
    text = tokenizer.render_chat(messages, add_generation_prompt=True, **template_kwargs)
    ids = tokenizer.encode(text)                        # no BOS added: the template has what it needs
    tokenizer.decode(ids)                               # special tokens skipped

Both run in the API process (prompts are rendered and counted before a request is admitted, so a
prompt longer than the context is a 400) and in the worker (detokenizing for stop strings).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


class TextTokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def render_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any
    ) -> str: ...

    def has_chat_template(self) -> bool: ...


class HFTokenizer:
    """A transformers tokenizer read from a folder (tokenizer.json, tokenizer_config.json)."""

    def __init__(self, folder: str | Path):
        from transformers import AutoTokenizer

        self.inner = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.vocab_size = len(self.inner)
        self.eos_token_ids = tuple(eos_ids_of(folder, self.inner.eos_token_id))
        # decoding through the Rust tokenizer directly: the Python wrapper costs more per call
        self._fast = getattr(self.inner, "backend_tokenizer", None)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def has_chat_template(self) -> bool:
        return bool(getattr(self.inner, "chat_template", None))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any) -> str:
        return self.inner.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )


def eos_ids_of(folder: str | Path, tokenizer_eos: int | None) -> list[int]:
    """generation_config.json's eos ids (Qwen3 stops at <|im_end|> and <|endoftext|>), else the
    tokenizer's."""
    import json

    ids: list[int] = []
    path = Path(folder) / "generation_config.json"
    if path.is_file():
        eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
        ids = list(eos) if isinstance(eos, list) else [] if eos is None else [eos]
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids.append(tokenizer_eos)
    return [int(i) for i in ids]


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255, Qwen's chat markers as special ids (at Qwen3's own ids when the
    vocabulary is that large, so its config's eos id means <|im_end|>). Deterministic; no files."""

    def __init__(self, vocab_size: int, special_ids: dict[str, int] | None = None):
        if special_ids is None:
            top = vocab_size if vocab_size < 151646 else 151646
            special_ids = {END_OF_TEXT: top - 3, IM_START: top - 2, IM_END: top - 1}
        self.vocab_size = vocab_size
        self.special_ids = special_ids
        self.special_of = {i: text for text, i in special_ids.items()}
        self.eos_token_ids = (special_ids[IM_END], special_ids[END_OF_TEXT])
        self._split = re.compile("(" + "|".join(re.escape(s) for s in special_ids) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self.special_ids:
                ids.append(self.special_ids[part])
            elif part:
                ids.extend(part.encode("utf-8"))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if all(token < 256 for token in ids):  # the common case: bytes only
            return bytes(ids).decode("utf-8", errors="replace")
        out, pending = [], bytearray()
        for token in ids:
            if token < 256:
                pending.append(token)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special_tokens:
                out.append(self.special_of.get(token, ""))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def has_chat_template(self) -> bool:
        return True

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool, **kwargs: Any) -> str:
        """Qwen's ChatML shape: <|im_start|>role\\ncontent<|im_end|>\\n per message."""
        text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
        return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def load_text_tokenizer(folder: str | Path | None, vocab_size: int) -> TextTokenizer:
    """The folder's tokenizer when it has one, else the byte fallback over `vocab_size` ids."""
    if folder is not None and (Path(folder) / "tokenizer_config.json").is_file():
        return HFTokenizer(folder)
    return ByteTokenizer(vocab_size)
