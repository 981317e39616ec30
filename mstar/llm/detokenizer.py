"""Output text as tokens arrive, and the stop strings checked against it.

`IncrementalDetokenizer` decodes a short window of ids per new token (vLLM's prefix/read offsets):
a token that ends inside a UTF-8 character adds no text until the character completes. `StopText`
holds back the last len(longest stop) - 1 characters while stop strings are set, so a stop string
split across two steps is never streamed in part; when one appears, the text ends just before it
(OpenAI's rule: the stop sequence is not returned).
"""

from __future__ import annotations

from mstar.llm.tokenizer import TextTokenizer

PROMPT_WINDOW = 5  # prompt tokens decoded along, so the first outputs join the prompt's bytes right


class IncrementalDetokenizer:
    def __init__(self, tokenizer: TextTokenizer, prompt_ids: list[int], skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-PROMPT_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token: int) -> str:
        """The text `token` completes (may be "" until a multi-byte character is whole)."""
        self.ids.append(int(token))
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = self.tokenizer.decode(self.ids[self.prefix_offset :], self.skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if len(self.ids) > 4 * PROMPT_WINDOW:  # keep the window short
            drop = self.prefix_offset
            self.ids = self.ids[drop:]
            self.prefix_offset, self.read_offset = 0, self.read_offset - drop
        return full[len(prefix) :]

    def flush(self) -> str:
        """What is left undecoded at the end (a character cut off by max_tokens: U+FFFD)."""
        rest = (
            self.tokenizer.decode(self.ids[self.read_offset :], self.skip)
            if self.read_offset < len(self.ids)
            else ""
        )
        self.read_offset = len(self.ids)
        return rest


class StopText:
    def __init__(self, stop: list[str]):
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.sent = 0  # characters of `text` already given out
        self.stopped = False

    def add(self, delta: str) -> str:
        """Append `delta`; returns the text that is safe to send now (all of it at a stop)."""
        if self.stopped or not delta:
            return ""
        searched_from = max(0, len(self.text) - self.hold)
        self.text += delta
        cut = min((i for s in self.stop if (i := self.text.find(s, searched_from)) >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = self.text[:cut], True
            return self._take(len(self.text))
        return self._take(len(self.text) - self.hold if self.stop else len(self.text))

    def finish(self) -> str:
        """The held-back tail, once generation ends without a stop string."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out
