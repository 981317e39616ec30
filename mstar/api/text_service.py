"""The API's path for text models: prompts through the frontend, one runtime request per choice,
their token pieces followed as they come (streamed or gathered), TTFT/TPOT and token counts to
/metrics. Every request's pieces arrive as runtime Piece events of the output "text" (TextPiece
dicts, mstar.llm.params); a failure anywhere aborts the other choices of the same HTTP request.
With DEBUG logging each finished choice logs its stages in ms after the HTTP request arrived
(submitted, at the node, first step queued, first token read back, first piece here, done).
Times are time.monotonic(): the workers' stages come in the first piece, from the same clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from mstar.api.errors import ApiError
from mstar.api.metrics import PrometheusMetrics
from mstar.api.service import failure_error, random_seed
from mstar.errors import Overloaded, UnknownModel
from mstar.llm.frontend import TextFrontend
from mstar.llm.params import TextRequest
from mstar.runtime.events import Done, Failed, Piece

TEXT_KEY = "text"
log = logging.getLogger("mstar.api")
WORKER_STAGES = (
    ("prepared", "at the node"),
    ("first_step", "first step queued"),
    ("first_token", "first token read"),
)


@dataclass
class Choice:
    """One generated continuation: choice `index` of prompt `prompt_index`."""

    index: int
    prompt_index: int
    request: TextRequest
    handle: Any = None
    text: str = ""
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    submitted_at: float | None = None  # time.monotonic(), when handed to the runtime
    first_token_s: float | None = None  # after arrival
    last_token_s: float | None = None
    first_piece_s: float | None = None  # after arrival (a non-streaming request's only piece)
    worker_times: dict[str, float] = field(default_factory=dict)  # the first piece's timeline
    pieces: list[dict[str, Any]] = field(default_factory=list)  # gathered (non-streaming)

    def take(self, piece: dict[str, Any], now_s: float) -> None:
        if self.first_piece_s is None:
            self.first_piece_s = now_s
            self.worker_times = piece.get("timeline") or {}
        self.text += piece.get("text", "")
        if piece.get("token_ids"):
            if self.first_token_s is None:
                self.first_token_s = now_s
            self.last_token_s = now_s
        self.finish_reason = piece.get("finish_reason") or self.finish_reason
        self.num_prompt_tokens = piece.get("num_prompt_tokens", self.num_prompt_tokens)
        self.num_cached_tokens = piece.get("num_cached_tokens", self.num_cached_tokens)
        self.num_output_tokens = piece.get("num_output_tokens", self.num_output_tokens)


class TextService:
    def __init__(self, config: Any, spec: Any, runtime: Any, metrics: PrometheusMetrics):
        self.config = config
        self.spec = spec
        self.runtime = runtime
        self.metrics = metrics
        self.frontend = TextFrontend(spec, config)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.spec.name:
            raise UnknownModel(model)

    def choices(
        self, prompts: list[list[int]], sampling: dict[str, Any], n: int, seed: int | None, stream: bool
    ) -> list[Choice]:
        """n choices per prompt, validated against the context; seeds seed, seed + 1, ... (a
        random base when none is given)."""
        base = random_seed() if seed is None else seed
        choices = []
        for prompt_index, prompt_ids in enumerate(prompts):
            for j in range(n):
                fields = sampling | {"seed": base + j}
                request = self.frontend.request(prompt_ids, fields, stream)
                choices.append(Choice(len(choices), prompt_index, request))
        return choices

    def submit(self, choices: list[Choice]) -> None:
        """All or nothing: when the queue fills part way, the ones admitted are aborted."""
        try:
            for choice in choices:
                choice.submitted_at = time.monotonic()  # before: the worker may start on it at once
                choice.handle = self.runtime.submit(
                    choice.request,
                    timeout_s=self.config.request_timeout_s,
                    stream_outputs=(TEXT_KEY,),
                )
        except Overloaded:
            self.metrics.count_rejected()
            self.abort(choices)
            raise
        except BaseException:
            self.abort(choices)
            raise

    def abort(self, choices: list[Choice]) -> None:
        for choice in choices:
            if choice.handle is not None and choice.finish_reason is None:
                self.runtime.abort(choice.handle.request_id)

    async def follow(self, choice: Choice, arrived: float) -> AsyncIterator[dict[str, Any]]:
        """The choice's pieces as they come; ApiError when its request fails. `arrived`: when its
        HTTP request did (time.monotonic())."""
        async for event in choice.handle.events():
            if isinstance(event, Piece) and event.key == TEXT_KEY:
                choice.take(event.value, time.monotonic() - arrived)
                yield event.value
            elif isinstance(event, Done):
                self._observe(choice)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s", timeline(choice, arrived, time.monotonic()))
                return
            elif isinstance(event, Failed):
                raise failure_error(event.kind, event.message)
        raise failure_error("error", "the event stream ended without a result")

    def _observe(self, choice: Choice) -> None:
        decode_s = (choice.last_token_s or 0.0) - (choice.first_token_s or 0.0)
        self.metrics.text.observe_request(
            choice.num_prompt_tokens, choice.num_output_tokens, choice.first_token_s, decode_s
        )

    async def merged(
        self, choices: list[Choice], arrived: float
    ) -> AsyncIterator[tuple[Choice, dict[str, Any]]]:
        """Every choice's pieces, interleaved as they arrive; the first failure ends it all (the
        others are aborted), and so does the caller going away."""
        if len(choices) == 1:
            async for piece in self.follow(choices[0], arrived):
                yield choices[0], piece
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            try:
                async for piece in self.follow(choice, arrived):
                    queue.put_nowait((choice, piece, None))
                queue.put_nowait((choice, None, None))
            except Exception as error:
                queue.put_nowait((choice, None, error))

        tasks = [asyncio.create_task(pump(choice)) for choice in choices]
        try:
            remaining = len(choices)
            while remaining:
                choice, piece, error = await queue.get()
                if error is not None:
                    raise error if isinstance(error, ApiError) else failure_error("error", str(error))
                if piece is None:
                    remaining -= 1
                else:
                    yield choice, piece
        finally:
            for task in tasks:
                task.cancel()

    async def gather(self, choices: list[Choice], arrived: float) -> list[Choice]:
        """Run every choice to its end (non-streaming), keeping their pieces."""
        async for choice, piece in self.merged(choices, arrived):
            choice.pieces.append(piece)
        return choices


def timeline(choice: Choice, arrived: float, done_at: float) -> str:
    """One line: the choice's stages in ms after its HTTP request arrived."""

    def ms(at: float | None) -> str:
        return "-" if at is None else f"{(at - arrived) * 1000:.1f}"

    stages = [f"submitted {ms(choice.submitted_at)}"]
    stages += [f"{label} {ms(choice.worker_times.get(key))}" for key, label in WORKER_STAGES]
    first_piece = None if choice.first_piece_s is None else arrived + choice.first_piece_s
    stages += [f"first piece {ms(first_piece)}", f"done {ms(done_at)}"]
    return (
        f"text request {choice.handle.request_id}: ms after arrival: {', '.join(stages)} "
        f"({choice.num_prompt_tokens} prompt tokens, {choice.num_cached_tokens} cached, "
        f"{choice.num_output_tokens} output)"
    )


def usage(choices: list[Choice]) -> dict[str, Any]:
    """OpenAI's usage: a prompt counted once however many choices it has."""
    prompts: dict[int, Choice] = {}
    for choice in choices:
        prompts.setdefault(choice.prompt_index, choice)
    prompt_tokens = sum(c.num_prompt_tokens for c in prompts.values())
    completion_tokens = sum(c.num_output_tokens for c in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(c.num_cached_tokens for c in prompts.values())},
    }
