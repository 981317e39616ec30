"""One request's generation on the worker: its sequence, detokenizer, stop rules and pending output.

The node calls `reserve()` when a step will sample the request's next token (a PENDING place in its
tokens, filled when the sample is read back, possibly after the next step was queued from the
device's copy), then `take(token, logprob info)`; the state decides whether the request stops (a
stop token id, EOS unless ignore_eos, a stop string, max_tokens, the context length) and collects
what the next TextPiece carries. The stop token itself is not part of the
text (OpenAI's and vLLM's default). The first piece also carries when the request reached the node,
when its first token's step was queued and when that token was read back (time.monotonic: the
workers share the API's host and its clock), for the API's per-request timeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mstar.llm.detokenizer import IncrementalDetokenizer, StopText
from mstar.llm.params import TextRequest
from mstar.llm.sequence import PENDING, Sequence
from mstar.llm.tokenizer import TextTokenizer


@dataclass(eq=False)
class Generation:
    request: TextRequest
    seq: Sequence
    tokenizer: TextTokenizer
    stop_ids: frozenset[int]
    max_model_len: int
    detokenizer: IncrementalDetokenizer = field(init=False)
    stop_text: StopText = field(init=False)
    finish_reason: str | None = None
    num_taken: int = 0  # sampled tokens read back so far
    prepared_at: float = field(default_factory=time.monotonic)
    first_step_at: float | None = None  # the step that samples the first token was queued
    first_token_at: float | None = None  # ... and read back
    _final_sent: bool = False
    _num_pieces: int = 0
    _pending: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.detokenizer = IncrementalDetokenizer(
            self.tokenizer, self.request.prompt_token_ids, self.request.skip_special_tokens
        )
        self.stop_text = StopText(self.request.sampling.stop)
        self._reset_pending()

    @classmethod
    def start(
        cls,
        seq: Sequence,
        request: TextRequest,
        tokenizer: TextTokenizer,
        eos_ids: tuple[int, ...],
        max_model_len: int,
    ) -> Generation:
        stop_ids = set(request.sampling.stop_token_ids)
        if not request.sampling.ignore_eos:
            stop_ids.update(eos_ids)
        return cls(request, seq, tokenizer, frozenset(stop_ids), max_model_len)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def reserve(self) -> None:
        """A step will sample this request's next token: hold its place (PENDING); when that is the
        last token the limits allow, no further step is planned for the sequence."""
        seq = self.seq
        if self.first_step_at is None:
            self.first_step_at = time.monotonic()
        seq.append(PENDING)
        seq.num_pending += 1
        if seq.num_outputs >= self.request.sampling.max_tokens or seq.num_tokens >= self.max_model_len:
            seq.done_sampling = True

    def take(
        self, token: int, logprob: float | None = None, top: list[tuple[str, float]] | None = None
    ) -> None:
        """The oldest reserved token, read back: record it, stop when a rule says so."""
        seq = self.seq
        seq.tokens[seq.num_prompt + self.num_taken] = int(token)
        seq.num_pending -= 1
        self.num_taken += 1
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        if self.finished:
            return  # a step queued before the stop was known: its token is dropped
        pending = self._pending
        if token in self.stop_ids:
            self._finish("stop")
            return
        pending["token_ids"].append(token)
        if logprob is not None:
            pending["logprobs"].append(logprob)
            pending["tokens"].append(self.tokenizer.decode([token], False))
            pending["top_logprobs"].append(top or [])
        pending["text"] += self.stop_text.add(self.detokenizer.add(token))
        if self.stop_text.stopped:
            self._finish("stop")
        elif (
            self.num_taken >= self.request.sampling.max_tokens
            or seq.num_prompt + self.num_taken >= self.max_model_len
        ):
            self._finish("length")

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        if not self.stop_text.stopped:
            self._pending["text"] += self.stop_text.add(self.detokenizer.flush()) + self.stop_text.finish()

    def piece(self) -> dict | None:
        """What to send now, a TextPiece as a plain dict (None while nothing is due: a
        non-streaming request sends once, at its end)."""
        pending = self._pending
        if self._final_sent or (not self.finished and (not self.request.stream or not pending["token_ids"])):
            return None
        self._final_sent = self.finished
        piece = {
            "token_ids": pending["token_ids"],
            "text": pending["text"],
            "num_prompt_tokens": self.seq.num_prompt,
            "num_cached_tokens": self.seq.num_cached_prompt,
            "num_output_tokens": self.num_taken,  # the stop token counts, as in vLLM and OpenAI
        }
        if self.finish_reason is not None:
            piece["finish_reason"] = self.finish_reason
        if self._num_pieces == 0:
            piece["timeline"] = {
                "prepared": self.prepared_at,
                "first_step": self.first_step_at,
                "first_token": self.first_token_at,
            }
        self._num_pieces += 1
        if self.request.sampling.logprobs is not None:
            piece.update(
                logprobs=pending["logprobs"], top_logprobs=pending["top_logprobs"], tokens=pending["tokens"]
            )
        self._reset_pending()
        return piece

    def output_ids(self) -> list[int]:
        """The generated ids read back, without a stop token at the end."""
        ids = self.seq.tokens[self.seq.num_prompt : self.seq.num_prompt + self.num_taken]
        return ids[:-1] if ids and self.finish_reason == "stop" and ids[-1] in self.stop_ids else ids

    def _reset_pending(self) -> None:
        self._pending = {"token_ids": [], "text": "", "logprobs": [], "top_logprobs": [], "tokens": []}
