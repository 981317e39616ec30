"""The API side of a text model: render and count prompts, check them against the context.

Torch-free (tokenizers and transformers' tokenizer only). Field checks that need no model (types,
ranges) live in the API's schemas; here are those that need the tokenizer or the context length,
each an InvalidParam naming the field.

    frontend = TextFrontend(spec, config)
    ids = frontend.chat_prompt(messages, template_kwargs)    # or frontend.completion_prompt(prompt)
    request = frontend.request(ids, sampling, stream=True)   # TextRequest, ready for the runtime
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from mstar.errors import InvalidParam
from mstar.llm.params import TextRequest, TextSampling


class TextFrontend:
    def __init__(self, spec: Any, config: Any):
        self.spec = spec
        self.tokenizer = spec.load_tokenizer(config)
        self.context_length = spec.context_length(config)
        vocabulary_id = Annotated[int, msgspec.Meta(ge=0, lt=self.tokenizer.vocab_size)]
        self._token_ids = list[vocabulary_id]

    def chat_prompt(
        self, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None
    ) -> list[int]:
        """The chat template over `messages` (roles and text content already checked) -> ids."""
        try:
            text = self.tokenizer.render_chat(messages, add_generation_prompt=True, **(template_kwargs or {}))
        except Exception as error:  # a template that raises (bad role order, say): the client's input
            raise InvalidParam("messages", f"the model's chat template refused them: {error}") from error
        return self._checked("messages", self.tokenizer.encode(text))

    def completion_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self._checked("prompt", self.tokenizer.encode(prompt))
        try:  # one C pass over the ids (and the copy), not min() and max() over Python ints
            ids = msgspec.convert(prompt, self._token_ids)
        except msgspec.ValidationError:
            vocab_size = self.tokenizer.vocab_size
            bad = next((t for t in prompt if type(t) is not int or not 0 <= t < vocab_size), None)
            raise InvalidParam(
                "prompt", f"token id {bad!r} is outside the vocabulary (0..{vocab_size - 1})"
            ) from None
        return self._checked("prompt", ids)

    def _checked(self, field: str, ids: list[int]) -> list[int]:
        if not ids:
            raise InvalidParam(field, "the prompt is empty")
        if len(ids) >= self.context_length:
            raise InvalidParam(
                field,
                f"the prompt is {len(ids)} tokens; this model's context is {self.context_length} "
                "(prompt and output together)",
            )
        return ids

    def request(self, prompt_ids: list[int], sampling: dict[str, Any], stream: bool) -> TextRequest:
        """`sampling`: TextSampling fields; max_tokens None = what the context leaves."""
        room = self.context_length - len(prompt_ids)
        max_tokens = sampling.get("max_tokens")
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise InvalidParam(
                "max_tokens",
                f"{max_tokens} output tokens after a {len(prompt_ids)}-token prompt exceed this model's "
                f"context of {self.context_length}; at most {room}",
            )
        fields = {key: value for key, value in sampling.items() if value is not None} | {
            "max_tokens": max_tokens
        }
        try:
            typed = msgspec.convert(fields, TextSampling)
        except msgspec.ValidationError as error:
            raise InvalidParam("sampling", str(error)) from error
        return TextRequest(prompt_ids, typed, stream=stream)
