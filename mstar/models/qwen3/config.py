"""Qwen3 (dense) configuration: the shapes of transformers' Qwen3Config, torch-free.

The API process reads it for limits (context length) and the KV pool geometry; the worker builds the
model from it. `QWEN3_CONFIGS` are the released sizes (for --random-weights without a folder); a
checkpoint folder's config.json (transformers' layout) wins when given.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

QWEN3_BOS_ID = 151643  # <|endoftext|>
QWEN3_EOS_ID = 151645  # <|im_end|>


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    bos_token_id: int | None = QWEN3_BOS_ID
    eos_token_id: int | list[int] | None = QWEN3_EOS_ID

    @classmethod
    def from_hf(cls, data: dict[str, Any]) -> Qwen3Config:
        """From a transformers config.json dict (rope_theta at the top, or in rope_parameters)."""
        rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
            raise ValueError(f"qwen3: rope scaling {rope!r} is not supported (default rotary only)")
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if "head_dim" not in values or values["head_dim"] is None:
            values["head_dim"] = data["hidden_size"] // data["num_attention_heads"]
        if "rope_theta" not in data and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        return cls(**values)

    @classmethod
    def load(cls, folder: str | Path) -> Qwen3Config:
        return cls.from_hf(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))

    def to_hf(self) -> dict[str, Any]:
        """A transformers Qwen3Config dict (for save_pretrained folders and the parity tests)."""
        data = asdict(self)
        data.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_act="silu")
        return data

    def with_changes(self, **changes: Any) -> Qwen3Config:
        return replace(self, **changes)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        if eos is None:
            return ()
        return tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)

    def num_parameters(self) -> int:
        """Weights of the model (the embedding once when tied)."""
        attention = (
            self.hidden_size * self.head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        )
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size + 2 * self.head_dim
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * (attention + mlp + norms) + embeddings + self.hidden_size

    def num_parameters_read_per_token(self) -> int:
        """Weights one decode step reads: all but the input embedding table, of which it reads one
        row a token (tied, that table is the lm_head's, which reads it whole)."""
        if self.tie_word_embeddings:
            return self.num_parameters()
        return self.num_parameters() - (self.vocab_size - 1) * self.hidden_size


def _released(hidden: int, intermediate: int, layers: int, heads: int, tie: bool) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=151936,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=tie,
    )


# The released dense Qwen3 models (their config.json files' shapes).
QWEN3_CONFIGS: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _released(1024, 3072, 28, 16, tie=True),
    "qwen3-1.7b": _released(2048, 6144, 28, 16, tie=True),
    "qwen3-4b": _released(2560, 9728, 36, 32, tie=True),
    "qwen3-8b": _released(4096, 12288, 36, 32, tie=False),
}
