"""One request's generation on the worker: its sequence, detokenizer, stop rules and pending output.

The node calls `take(token, logprob info)` for every sampled token; the state decides whether the
request stops (a stop token id, EOS unless ignore_eos, a stop string, max_tokens, the context
length) and collects what the next TextPiece carries. The stop token itself is not part of the
text (OpenAI's and vLLM's default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mstar.llm.detokenizer import IncrementalDetokenizer, StopText
from mstar.llm.params import TextPiece, TextRequest
from mstar.llm.sequence import Sequence
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

    def take(
        self, token: int, logprob: float | None = None, top: list[tuple[str, float]] | None = None
    ) -> None:
        """A sampled token: record it, stop when a rule says so."""
        self.seq.append(token)
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
            self.seq.num_outputs >= self.request.sampling.max_tokens
            or self.seq.num_tokens >= self.max_model_len
        ):
            self._finish("length")

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        if not self.stop_text.stopped:
            self._pending["text"] += self.stop_text.add(self.detokenizer.flush()) + self.stop_text.finish()

    def piece(self) -> TextPiece | None:
        """What to send now (None while nothing is due: a non-streaming request sends at its end)."""
        if not self.finished and (not self.request.stream or not self._pending["token_ids"]):
            return None
        pending = self._pending
        with_logprobs = self.request.sampling.logprobs is not None
        piece = TextPiece(
            token_ids=pending["token_ids"],
            text=pending["text"],
            logprobs=pending["logprobs"] if with_logprobs else None,
            top_logprobs=pending["top_logprobs"] if with_logprobs else None,
            tokens=pending["tokens"] if with_logprobs else None,
            finish_reason=self.finish_reason,
            num_prompt_tokens=self.seq.num_prompt,
            num_cached_tokens=self.seq.num_cached_prompt,
            num_output_tokens=self.seq.num_outputs,  # the stop token counts, as in vLLM and OpenAI
        )
        self._reset_pending()
        return piece

    def output_ids(self) -> list[int]:
        """The generated ids, without a stop token at the end."""
        ids = self.seq.output_ids
        return ids[:-1] if ids and self.finish_reason == "stop" and ids[-1] in self.stop_ids else ids

    def _reset_pending(self) -> None:
        self._pending = {"token_ids": [], "text": "", "logprobs": [], "top_logprobs": [], "tokens": []}
