"""One generation as the scheduler sees it: its tokens, how many of them the pool holds, its pages.

Pure Python. `tokens` is the prompt followed by the outputs sampled so far; `num_computed` of them
have their keys and values in the pool (in `pages`, in order). The next step computes tokens
num_computed .. and, once every token is computed, samples the next one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from mstar.engine.kv.pages import chain_hashes, root_hash

PENDING = -1  # a token sampled on the device and not read back yet (the next step is fed from there)


class Status(enum.Enum):
    WAITING = "waiting"  # not admitted yet, or preempted (its pages given back; recomputed later)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: str
    tokens: list[int]  # prompt, then outputs
    num_prompt: int
    arrival: int  # admission order: lower is older (preemption takes the highest)
    namespace: str = ""  # prefix-cache namespace: sequences share pages only within one
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    num_cached_prompt: int = 0  # prompt tokens the prefix cache served at the first admission
    num_preemptions: int = 0
    admitted: bool = False  # admitted once (the first admission counts the prefix-cache hit)
    num_pending: int = 0  # PENDING tokens at the end of `tokens`
    done_sampling: bool = False  # its last allowed token is sampled: no step for it any more
    _hashes: list[bytes] = field(default_factory=list)

    @classmethod
    def new(cls, seq_id: str, prompt_ids: list[int], arrival: int, namespace: str = "") -> Sequence:
        if not prompt_ids:
            raise ValueError(f"sequence {seq_id}: empty prompt")
        return cls(seq_id, list(prompt_ids), len(prompt_ids), arrival, namespace)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_outputs(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed

    @property
    def is_decode(self) -> bool:
        """Only the last sampled token is left to compute (one-token step)."""
        return self.num_computed > 0 and self.num_uncomputed == 1

    def append(self, token: int) -> None:
        self.tokens.append(int(token))

    def page_hashes(self, num_pages: int, page_tokens: int) -> list[bytes]:
        """The chained hashes of the first `num_pages` full pages of `tokens` (kept, extended)."""
        hashes = self._hashes
        if len(hashes) < num_pages:
            parent = hashes[-1] if hashes else root_hash(self.namespace)
            start, stop = len(hashes) * page_tokens, num_pages * page_tokens
            hashes += chain_hashes(parent, self.tokens[start:stop], page_tokens)
        return hashes[:num_pages]
