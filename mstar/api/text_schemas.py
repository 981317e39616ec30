"""Bodies of POST /v1/chat/completions and /v1/completions (OpenAI shapes, plus vLLM's sampling
extensions top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids, chat_template_kwargs).

Types and ranges here, each error a 400 naming its field; what needs the tokenizer or the context
length (prompt too long, max_tokens past the context) is checked by mstar.llm.frontend.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mstar.api.schemas import MAX_SEED, Float, Int
from mstar.errors import InvalidParam
from mstar.llm.params import MAX_LOGPROBS, MAX_STOP_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS

MAX_N = 16
MAX_MESSAGES = 1024
MAX_PROMPTS = 64
ROLES = ("system", "developer", "user", "assistant", "tool")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")  # image_url / input_audio parts carry their own fields
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's; accepted, not used


class _SamplingFields(_Strict):
    """What both routes share."""

    model: str | None = None
    max_tokens: Int | None = Field(None, ge=1)
    temperature: Float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: Float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: Int | None = Field(None, ge=-1)
    min_p: Float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    n: Int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Int] | None = Field(None, max_length=MAX_STOP_TOKEN_IDS)
    seed: Int | None = Field(None, ge=0, le=MAX_SEED)
    presence_penalty: Float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: Float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: Float | None = Field(None, gt=0, le=10, allow_inf_nan=False)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[str, Float] | None = None
    user: str | None = None  # accepted, unused

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
        for stop in stops:
            if not 1 <= len(stop) <= MAX_STOP_CHARS:
                raise ValueError(f"each stop string has 1 to {MAX_STOP_CHARS} characters, got {len(stop)}")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict | None) -> dict | None:
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> dict[str, Any]:
        """TextSampling fields (None: the default)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": 0 if self.top_k in (None, -1) else self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "ignore_eos": self.ignore_eos,
            "logprobs": logprobs,
        }


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None

    def check(self) -> None:
        """Cross-field rules (raised as InvalidParam, outside pydantic, so the field is named)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParam("top_logprobs", "needs logprobs: true")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise InvalidParam("response_format", "only {'type': 'text'} is supported")
        if self.tools:
            raise InvalidParam("tools", "tool calls are not supported")

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self, accepts_images: bool) -> list[dict[str, Any]]:
        """Messages with text content for the chat template (parts joined); image or audio parts
        are refused for a text-only model."""
        rendered = []
        for index, message in enumerate(self.messages):
            content = message.content
            if isinstance(content, list):
                texts = []
                for part_index, part in enumerate(content):
                    if part.type != "text":
                        where = f"messages[{index}].content[{part_index}]"
                        if accepts_images:
                            raise InvalidParam(where, f"'{part.type}' parts are not supported yet")
                        raise InvalidParam(where, f"this model is text-only: '{part.type}' parts are refused")
                    texts.append(part.text or "")
                content = "".join(texts)
            rendered.append({"role": message.role, "content": content or ""})
        return rendered


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[Int] | list[list[Int]]
    logprobs: Int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: Int | None = None
    suffix: str | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _token_ids_at_once(cls, value: Any, handler: Any) -> Any:
        # A list of plain ints (a token-id prompt) is what the union gives back for it, checked and
        # copied in one C pass here (msgspec's strict list[int]: no bools, no floats; ints past 64
        # bits go on to the union): the union tries its members item by item (list[str] alone made
        # an error object for each of a 2k-id prompt's ids before list[Int] took it).
        if type(value) is list and value:
            try:
                return msgspec.convert(value, list[int])
            except msgspec.ValidationError:
                pass
        return handler(value)

    def check(self) -> None:
        if self.echo:
            raise InvalidParam("echo", "echo is not supported")
        if self.suffix:
            raise InvalidParam("suffix", "suffix is not supported")
        if self.best_of not in (None, self.n):
            raise InvalidParam("best_of", "best_of other than n is not supported")

    def prompts(self) -> list[str | list[int]]:
        """One prompt or a batch: strings or token id lists."""
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts: list = [prompt]
        elif prompt and isinstance(prompt[0], int):  # validated: the items are all of one kind
            prompts = [list(prompt)]
        else:
            prompts = list(prompt)
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise InvalidParam("prompt", f"give 1 to {MAX_PROMPTS} prompts")
        for prompt_item in prompts:
            if (isinstance(prompt_item, str) and not prompt_item) or (
                isinstance(prompt_item, list) and not prompt_item
            ):
                raise InvalidParam("prompt", "the prompt is empty")
        return prompts
