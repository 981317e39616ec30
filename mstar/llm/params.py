"""A text request's typed parameters (msgspec Structs): what the API validated, what the node runs.

TextRequest is the LLM specs' `params_type` (an mstar.params.RequestParams): it crosses processes
inside RunWalk as msgpack and decodes, checked, into this Struct on the worker; the node never sees
an unvalidated field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from mstar.params import RequestParams

if TYPE_CHECKING:  # the sampler imports torch; the params stay light for the API process
    from mstar.llm.sampling import RowSampling

MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_LOGPROBS = 20


class TextSampling(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = 0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k: the chosen token's and the k most likely

    def row(self, index: int) -> RowSampling:
        """The sampler's parameters for this request's `index`-th output token."""
        from mstar.llm.sampling import RowSampling

        return RowSampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            seed=self.seed,
            index=index,
            num_logprobs=self.logprobs,
        )


class TextRequest(RequestParams, frozen=True, forbid_unknown_fields=True):
    prompt_token_ids: list[int]
    sampling: TextSampling
    stream: bool = False  # send tokens step by step (else once, at the end)
    skip_special_tokens: bool = True


class TextPiece(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the node sends per step per request (inline output piece "text"); sent as the plain
    dict of these fields (mstar.llm.generation builds it), read by the API."""

    token_ids: list[int] = []
    text: str = ""
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[str, float]]] | None = None  # per token: (token text, logprob)
    tokens: list[str] | None = None  # per token, its own text (with logprobs)
    finish_reason: str | None = None  # "stop" | "length" on the last piece
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    # the first piece: when the node got the request, queued its first token's step and read that
    # token back ("prepared", "first_step", "first_token": time.monotonic() of the worker's host)
    timeline: dict[str, float] | None = None
