"""The `text_encoder` node the Wan2.2 and Z-Image models share: one encoder forward per batch.

Each model brings its own prompt encoder (UMT5 for Wan, Qwen3 for Z-Image: `encode(prompts)` ->
one [num_tokens_i, hidden] tensor per prompt) and its own guidance rule (when the negative prompt is
encoded too); the batching and the request.tensors keys are the same and live here. Light: no torch
at import (the encoders bring it).
"""

from __future__ import annotations

from typing import Any

from mstar.graph import Node, RequestState

PROMPT_EMBEDS = "prompt_embeds"
NEGATIVE_PROMPT_EMBEDS = "negative_prompt_embeds"


class PromptEmbedsNode(Node):
    """Encodes every prompt of the batch (and negative prompts under guidance) in one forward.

    Stores request.tensors[PROMPT_EMBEDS] and, when `uses_guidance(params)`, [NEGATIVE_PROMPT_EMBEDS]
    (the negative prompt defaults to ""). Subclasses give the model's guidance rule."""

    def __init__(self, encoder: Any, name: str = "text_encoder", max_batch_size: int = 8):
        self.encoder = encoder
        self.name = name
        self.max_batch_size = max_batch_size

    def uses_guidance(self, params: dict[str, Any]) -> bool:
        raise NotImplementedError

    def forward(self, batch: list[RequestState]) -> None:
        prompts: list[str] = []
        targets: list[tuple[RequestState, str]] = []
        for request in batch:
            prompts.append(request.params["prompt"])
            targets.append((request, PROMPT_EMBEDS))
            if self.uses_guidance(request.params):
                prompts.append(request.params.get("negative_prompt") or "")
                targets.append((request, NEGATIVE_PROMPT_EMBEDS))
        for (request, key), embeds in zip(targets, self.encoder.encode(prompts), strict=True):
            request.tensors[key] = embeds
