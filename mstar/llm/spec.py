"""LLMSpec: what every text model's spec shares (torch-free; the API process imports it).

One node, "llm", in a Loop: walk "generate" runs engine steps until the request stops and leaves
"token_ids"; its text streams out as inline pieces. A family subclass says where its config,
tokenizer and weights come from (`model_config`, `load_tokenizer`, `build_nodes`).

Params: `TextRequest` (mstar.llm.params) is the spec's `params_type`. The text routes validate a
request into it through mstar.llm.frontend (the prompt against the tokenizer and the context); the
runtime carries it in RunWalk and the node reads it typed. `validate` serves the image and video
routes' fields, which a text model refuses (400 naming "model").
"""

from __future__ import annotations

from typing import Any

from mstar.errors import InvalidParam
from mstar.graph import GenerationParams, Loop, ModelSpec, Walk
from mstar.llm.params import TextRequest, TextSampling

LLM_NODE, GENERATE = "llm", "generate"
TOKEN_IDS = "token_ids"
WARMUP_PROMPT_TOKENS = 8


class LLMSpec(ModelSpec):
    task = "text-generation"
    output_kind = "text"
    params_type = TextRequest
    output_tensor = TOKEN_IDS
    node_names = (LLM_NODE,)
    walks = {GENERATE: Walk(GENERATE, (Loop(LLM_NODE),), outputs=(TOKEN_IDS,))}
    accepts_images = False  # a text-only model: image parts in a chat message are refused

    # ---- family hooks ------------------------------------------------------------------------

    def model_config(self, config: Any) -> Any:
        """The family's model config (for shapes, context length and eos ids)."""
        raise NotImplementedError

    def load_tokenizer(self, config: Any) -> Any:
        """The TextTokenizer of this server's model (its folder's, or a fallback)."""
        raise NotImplementedError

    def max_position_embeddings(self, config: Any) -> int:
        return int(self.model_config(config).max_position_embeddings)

    # ---- shared -----------------------------------------------------------------------------

    def context_length(self, config: Any) -> int:
        """Prompt plus output tokens one request may hold: max_model_len, else the model's."""
        model_len = self.max_position_embeddings(config)
        return min(model_len, config.max_model_len) if config.max_model_len else model_len

    def limits(self) -> dict[str, Any]:
        return {"max_logprobs": 20}

    def validate(self, params: GenerationParams) -> TextRequest:
        raise InvalidParam(
            "model", f"{self.name} generates text: use /v1/chat/completions or /v1/completions"
        )

    def first_walk(self, params: TextRequest) -> str:
        return GENERATE

    def next_walk(self, params: TextRequest, finished: str) -> str | None:
        return None

    def warmup_requests(self, config: Any) -> list[TextRequest]:
        """One short greedy request through the walk, so no user request pays a first step."""
        if not config.warmup:
            return []
        request = TextRequest(
            list(range(1, WARMUP_PROMPT_TOKENS + 1)), TextSampling(max_tokens=2, temperature=0.0)
        )
        return [request]
