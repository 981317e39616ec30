"""tiny-chat as the runtime sees it: a Qwen3-shaped model small enough for any laptop, with its
weights, tokenizer and chat template shipped in the package (weights/, transformers' layout),
trained by `python -m mstar.models.tiny_chat.train` on generated arithmetic chats."""

from __future__ import annotations

from pathlib import Path

from mstar.models.qwen3.model import Qwen3Spec

WEIGHTS_DIR = Path(__file__).parent / "weights"


class TinyChatSpec(Qwen3Spec):
    name = "tiny-chat"
    weights_dir = WEIGHTS_DIR
