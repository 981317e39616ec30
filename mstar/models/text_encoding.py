"""The `text_encoder` node the Wan2.2 and Z-Image models share, and its prompt-embedding cache.

Each model brings its own prompt encoder (UMT5 for Wan, Qwen3 for Z-Image: `encode(prompts)` ->
one [num_tokens_i, hidden] tensor per prompt, each encoded alone) and its own guidance rule (when
the negative prompt is encoded too); the batching, the cache and the request.tensors keys are the
same and live here. Light: no torch at import (the encoders bring it).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mstar.graph import Node, RequestState
from mstar.params import ImageParams

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"
DEFAULT_PROMPT_CACHE_BYTES = 64 * 1024 * 1024


class PromptEmbedsCache:
    """Embeddings by prompt text, least recently used dropped first, within `max_bytes`.

    The encoder is launch-bound (Qwen3-4B: 32 ms per prompt on an H200 host, 52 ms after an idle
    gap, where reading its 8 GB of weights takes under 2 ms), and the same texts come back: Wan's
    negative prompt on every guided request, a prompt tried with several seeds. A prompt is encoded
    alone, so a cached embedding is the one a fresh forward gives. Consumers only read them (they
    are shared)."""

    def __init__(self, max_bytes: int = DEFAULT_PROMPT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0

    def get(self, prompt: str) -> Any | None:
        embeds = self._entries.get(prompt)
        if embeds is None:
            self.num_misses += 1
            return None
        self._entries.move_to_end(prompt)
        self.num_hits += 1
        return embeds

    def put(self, prompt: str, embeds: Any) -> None:
        if self.max_bytes <= 0 or prompt in self._entries:
            return
        if embeds.nbytes > self.max_bytes:
            return
        while self._entries and self.num_bytes + embeds.nbytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.num_bytes -= dropped.nbytes
        self._entries[prompt] = embeds
        self.num_bytes += embeds.nbytes

    def __len__(self) -> int:
        return len(self._entries)


class PromptEmbedsNode(Node):
    """Encodes the prompts of the batch (and negative prompts under guidance) not in its cache.

    Stores request.tensors[PROMPT_EMBEDS] and, when `uses_guidance(params)`, [NEGATIVE_PROMPT_EMBEDS]
    (the negative prompt defaults to ""). A text twice in one batch is encoded once.
    `max_cached_bytes` 0 turns the cache off. Subclasses give the model's guidance rule."""

    def __init__(
        self,
        encoder: Any,
        name: str = "text_encoder",
        max_batch_size: int = 8,
        max_cached_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
    ):
        self.encoder = encoder
        self.name = name
        self.max_batch_size = max_batch_size
        self.cache = PromptEmbedsCache(max_cached_bytes)

    def uses_guidance(self, params: ImageParams) -> bool:
        raise NotImplementedError

    def event_counts(self) -> dict[str, int]:
        return {"prompt_cache_hits": self.cache.num_hits, "prompt_cache_misses": self.cache.num_misses}

    def warmup(self) -> None:
        """The encoder's own warmup, where it has one (Z-Image's captures its CUDA graphs)."""
        if hasattr(self.encoder, "warmup"):
            self.encoder.warmup()

    def forward(self, batch: list[RequestState]) -> None:
        targets: list[tuple[RequestState, str, str]] = []  # (request, tensor key, prompt text)
        for request in batch:
            targets.append((request, PROMPT_EMBEDS, request.params.prompt))
            if self.uses_guidance(request.params):
                targets.append((request, NEGATIVE_PROMPT_EMBEDS, request.params.negative_prompt))
        found = {text: self.cache.get(text) for text in dict.fromkeys(text for _, _, text in targets)}
        missing = [text for text, embeds in found.items() if embeds is None]
        for text, embeds in zip(missing, self.encoder.encode(missing), strict=True):
            found[text] = embeds
            self.cache.put(text, embeds)
        for request, key, text in targets:
            request.tensors[key] = found[text]
