"""POST /v1/chat/completions and /v1/completions for text models (OpenAI shapes).

Streaming answers are server-sent events in OpenAI's chunk shape, ending with `data: [DONE]`;
`stream_options.include_usage` adds a last chunk with the usage. Non-streaming answers carry
`usage`. A client that goes away aborts its requests, which gives their KV pages back. A failure
after the stream started is one `data: {"error": ...}` event before [DONE].
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from mstar.api.errors import ApiError, error_body
from mstar.api.middleware import read_fields
from mstar.api.routes_images import until_disconnected
from mstar.api.state import server_state
from mstar.api.text_schemas import ChatCompletionRequest, CompletionRequest
from mstar.api.text_service import Choice, TextService, usage

logger = logging.getLogger("mstar.api")
router = APIRouter()
SSE = "text/event-stream"


def _text_service(request: Request) -> TextService:
    state = server_state(request)
    if state.text is None:
        raise ApiError(
            400,
            f"model '{state.spec.name}' is {state.spec.task}; this route generates text",
            param="model",
            code="unsupported_mode",
        )
    return state.text


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    arrived = time.monotonic()
    service = _text_service(request)
    body = ChatCompletionRequest.model_validate(await read_fields(request))
    body.check()
    service.check_model(body.model)
    messages = body.template_messages(service.spec.accepts_images)
    prompt_ids = service.frontend.chat_prompt(messages, body.chat_template_kwargs)
    sampling = body.sampling(body.output_limit(), body.num_logprobs())
    choices = service.choices([prompt_ids], sampling, body.n, body.seed, body.stream)
    return await _respond(request, service, body, choices, arrived, ChatFormat(service.spec.name))


@router.post("/v1/completions")
async def completions(request: Request):
    arrived = time.monotonic()
    service = _text_service(request)
    body = CompletionRequest.model_validate(await read_fields(request))
    body.check()
    service.check_model(body.model)
    prompts = [service.frontend.completion_prompt(prompt) for prompt in body.prompts()]
    # OpenAI's legacy default is 16 tokens; None here would be what the context leaves
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    sampling = body.sampling(max_tokens, body.logprobs)
    choices = service.choices(prompts, sampling, body.n, body.seed, body.stream)
    return await _respond(request, service, body, choices, arrived, CompletionFormat(service.spec.name))


async def _respond(request: Request, service: TextService, body, choices: list[Choice], arrived: float, fmt):
    server_state(request).generator.check_ready()
    service.submit(choices)
    if body.stream:
        events = _stream(service, choices, arrived, fmt, body.include_usage)
        return StreamingResponse(events, media_type=SSE, headers={"Cache-Control": "no-cache"})
    try:
        done = await until_disconnected(request, service.gather(choices, arrived))
    finally:
        service.abort(choices)  # no-op for finished ones; the rest when the client went away
    return JSONResponse(fmt.response(done))


async def _stream(
    service: TextService, choices: list[Choice], arrived: float, fmt, include_usage: bool
) -> AsyncIterator[bytes]:
    try:
        for choice in choices:
            first = fmt.first_chunk(choice)
            if first is not None:
                yield _event(first, include_usage)
        async for choice, piece in service.merged(choices, arrived):
            yield _event(fmt.chunk(choice, piece), include_usage)
        if include_usage:
            yield _event(fmt.usage_chunk(usage(choices)), False)
    except ApiError as error:
        yield _event(error_body(error.message, error.type, error.param, error.code), False)
    except Exception:
        logger.exception("text stream failed")
        yield _event(
            error_body("The server had an error while processing your request.", "server_error"), False
        )
    finally:
        service.abort(choices)  # a client that went away (the generator is closed) frees the pages
    yield b"data: [DONE]\n\n"


def _event(data: dict[str, Any], with_usage_field: bool) -> bytes:
    if with_usage_field and "usage" not in data:
        data["usage"] = None
    return b"data: " + json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def _token_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


class _Format:
    object_name = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, model: str):
        self.model = model
        self.id = f"{self.id_prefix}{secrets.token_hex(12)}"
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def usage_chunk(self, counts: dict[str, Any]) -> dict[str, Any]:
        return self._envelope(self.chunk_object, []) | {"usage": counts}

    def first_chunk(self, choice: Choice) -> dict[str, Any] | None:
        return None

    def response(self, choices: list[Choice]) -> dict[str, Any]:
        return self._envelope(self.object_name, [self.final_choice(c) for c in choices]) | {
            "usage": usage(choices)
        }

    def final_choice(self, choice: Choice) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, choice: Choice, piece: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class ChatFormat(_Format):
    object_name, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def first_chunk(self, choice: Choice) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        return self._envelope(
            self.chunk_object,
            [{"index": choice.index, "delta": delta, "logprobs": None, "finish_reason": None}],
        )

    def chunk(self, choice: Choice, piece: dict[str, Any]) -> dict[str, Any]:
        delta = {"content": piece["text"]} if piece.get("text") or not piece.get("finish_reason") else {}
        entry = {
            "index": choice.index,
            "delta": delta,
            "logprobs": self._logprobs([piece]) if piece.get("logprobs") is not None else None,
            "finish_reason": piece.get("finish_reason"),
        }
        return self._envelope(self.chunk_object, [entry])

    def final_choice(self, choice: Choice) -> dict[str, Any]:
        with_logprobs = choice.request.sampling.logprobs is not None
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": self._logprobs(choice.pieces) if with_logprobs else None,
            "finish_reason": choice.finish_reason,
        }

    @staticmethod
    def _logprobs(pieces: list[dict[str, Any]]) -> dict[str, Any]:
        content = []
        for piece in pieces:
            for token, logprob, top in zip(
                piece.get("tokens") or [],
                piece.get("logprobs") or [],
                piece.get("top_logprobs") or [],
                strict=True,
            ):
                content.append(
                    _token_entry(token, logprob) | {"top_logprobs": [_token_entry(t, lp) for t, lp in top]}
                )
        return {"content": content}


class CompletionFormat(_Format):
    object_name, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"

    def chunk(self, choice: Choice, piece: dict[str, Any]) -> dict[str, Any]:
        entry = {
            "index": choice.index,
            "text": piece.get("text", ""),
            "logprobs": self._logprobs([piece], len(choice.text) - len(piece.get("text", "")))
            if piece.get("logprobs") is not None
            else None,
            "finish_reason": piece.get("finish_reason"),
        }
        return self._envelope(self.chunk_object, [entry])

    def final_choice(self, choice: Choice) -> dict[str, Any]:
        with_logprobs = choice.request.sampling.logprobs is not None
        return {
            "index": choice.index,
            "text": choice.text,
            "logprobs": self._logprobs(choice.pieces, 0) if with_logprobs else None,
            "finish_reason": choice.finish_reason,
        }

    @staticmethod
    def _logprobs(pieces: list[dict[str, Any]], offset: int) -> dict[str, Any]:
        tokens = [t for p in pieces for t in p.get("tokens") or []]
        offsets, position = [], offset
        for token in tokens:
            offsets.append(position)
            position += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [lp for p in pieces for lp in p.get("logprobs") or []],
            "top_logprobs": [dict(top) for p in pieces for top in p.get("top_logprobs") or []],
            "text_offset": offsets,
        }
