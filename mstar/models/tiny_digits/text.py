"""A word-level tokenizer and a small text encoder for digit prompts.

Every prompt starts with <bos>, so the empty prompt (the unconditional side of classifier-free
guidance) is one token and attention never sees an empty text. Words outside the vocabulary map to
<unk>. The encoder is an embedding table followed by one pre-norm self-attention block, so a word's
vector can depend on its neighbours ("the number seven" vs "seven"); its output goes to the DiT's
text projection exactly like UMT5's output does in Wan.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mstar.models.tiny_digits.data import DIGIT_WORDS, PROMPT_TEMPLATES

PAD, BOS, UNK = "<pad>", "<bos>", "<unk>"
WORD_PATTERN = re.compile(r"[a-z]+|\d+")


def build_vocab() -> list[str]:
    """Specials, digits, digit words, then every word the templates use (sorted: stable ids)."""
    template_words = {w for t in PROMPT_TEMPLATES for w in WORD_PATTERN.findall(t.lower())}
    template_words -= {"d", "w"}
    extra_words = {"digit", "number", "numeral", "handwritten", "written", "hand", "drawing", "picture"}
    words = sorted((template_words | extra_words) - set(DIGIT_WORDS))
    return [PAD, BOS, UNK, *(str(d) for d in range(10)), *DIGIT_WORDS, *words]


class WordTokenizer:
    def __init__(self, vocab: list[str], max_tokens: int):
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.ids = {word: index for index, word in enumerate(vocab)}

    @classmethod
    def load(cls, path: Path, max_tokens: int) -> WordTokenizer:
        return cls(json.loads(path.read_text()), max_tokens)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.vocab) + "\n")

    def encode(self, prompt: str) -> list[int]:
        """Token ids: <bos> then up to max_tokens words (unknown words -> <unk>)."""
        words = WORD_PATTERN.findall(prompt.lower())[: self.max_tokens]
        return [self.ids[BOS], *(self.ids.get(word, self.ids[UNK]) for word in words)]


def make_text_encoder(vocab_size: int, text_dim: int, num_heads: int = 2):
    """The encoder module (torch imported here so the spec stays light)."""
    import torch
    from torch import nn

    class TinyTextEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab_size, text_dim)
            self.norm1 = nn.LayerNorm(text_dim)
            self.attn = nn.MultiheadAttention(text_dim, num_heads, batch_first=True)
            self.norm2 = nn.LayerNorm(text_dim)
            self.ffn = nn.Sequential(
                nn.Linear(text_dim, 2 * text_dim), nn.GELU(), nn.Linear(2 * text_dim, text_dim)
            )
            self.final_norm = nn.LayerNorm(text_dim)

        def forward(self, token_ids: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
            # token_ids [B, L]; padding_mask [B, L] True at padding -> embeddings [B, L, text_dim]
            hidden = self.embed_tokens(token_ids)
            normed = self.norm1(hidden)
            attended, _ = self.attn(normed, normed, normed, key_padding_mask=padding_mask, need_weights=False)
            hidden = hidden + attended
            hidden = hidden + self.ffn(self.norm2(hidden))
            return self.final_norm(hidden)

    return TinyTextEncoder()


def pad_token_ids(token_lists: list[list[int]]):
    """Right-pad to the longest: (ids [B, L] int64, padding_mask [B, L] bool)."""
    import torch

    max_len = max(len(ids) for ids in token_lists)
    ids = torch.zeros(len(token_lists), max_len, dtype=torch.long)
    mask = torch.ones(len(token_lists), max_len, dtype=torch.bool)
    for row, token_ids in enumerate(token_lists):
        ids[row, : len(token_ids)] = torch.tensor(token_ids)
        mask[row, : len(token_ids)] = False
    return ids, mask
