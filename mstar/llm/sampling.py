"""Sampling on the device for every row of a step, each row with its own parameters.

Order (as vLLM's sampler): penalties (repetition over prompt and outputs; frequency and presence
over outputs) -> greedy rows take the argmax; the others: temperature -> min_p -> top_k -> top_p ->
one exponential race (argmax of probs / E, E = -log U, an exact draw from the filtered
distribution) with seeded noise (mstar.llm.noise). Logprobs are of the model's raw distribution
(log_softmax of the logits before any processing, vLLM's default), with up to 20 top alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar.llm.noise import VocabNoise, row_key, uniforms

GREEDY_BELOW = 1e-5  # temperatures this small are greedy (dividing by them overflows)
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class RowSampling:
    """One row's parameters (from the request) and where it stands."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int = 0
    index: int = 0  # which output token this is (the noise counter)
    num_logprobs: int | None = None  # None: no logprobs; k: the token's and k alternatives

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0


@dataclass
class PendingSamples:
    """One step's samples: on the device (`token_ids`, to feed the next step) and on their way to
    the host (non-blocking copies; `read` waits for them alone, not for work queued after)."""

    token_ids: torch.Tensor
    host: list[torch.Tensor]  # token ids, then (with logprobs) chosen logprobs, top ids, top values
    copied: torch.cuda.Event | None
    num_top: int

    def done(self) -> bool:
        """Whether the device is known to be past the copies, so `read` would not wait (asked
        without a sync). A CPU step has no copies in flight and says False: a node that overlaps
        steps on the CPU (tests) keeps the order it takes while a GPU still runs the step."""
        return self.copied is not None and self.copied.query()

    def read(self) -> SampleOutput:
        if self.copied is not None:
            self.copied.synchronize()
        ids = self.host[0].tolist()
        if len(self.host) == 1:
            return SampleOutput(ids, None, None, None)
        if self.num_top:
            return SampleOutput(ids, self.host[1].tolist(), self.host[2].tolist(), self.host[3].tolist())
        return SampleOutput(ids, self.host[1].tolist(), None, None)


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.device.type != "cuda":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def _event_after(device: torch.device) -> torch.cuda.Event | None:
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


@dataclass
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float] | None  # of the chosen tokens (None when no row asked)
    top_ids: list[list[int]] | None  # per row, the k_max most likely ids
    top_logprobs: list[list[float]] | None


def exponential_race(probs: torch.Tensor, keys: torch.Tensor, vocab_hashes: torch.Tensor) -> torch.Tensor:
    """probs float32 [N, V], keys int64 [N] -> int64 [N]: argmax of probs / E, E = -log U with the
    rows' seeded uniforms. About 25 elementwise passes over [N, V] in int64 when eager; compiled,
    one kernel that never writes the noise out."""
    return (probs / -torch.log(uniforms(keys, vocab_hashes))).argmax(dim=-1)


class Sampler:
    """`compile_mode` (not "off"): the exponential race is compiled (mstar.engine.compile), once
    for every row count; `warmup` compiles it at boot."""

    def __init__(self, vocab_size: int, device: torch.device, compile_mode: str = "off"):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.noise = VocabNoise(vocab_size, self.device)
        self.compiled = None
        self._race = exponential_race
        if compile_mode != "off":
            from mstar.engine.compile import CompiledFunction

            self.compiled = CompiledFunction(exponential_race, compile_mode, "llm.sampler.race")
            self._race = self.compiled

    @torch.inference_mode()  # as the runner calls it: dynamo guards on the grad mode
    def warmup(self) -> None:
        """Compile the race for one row and for many (a dynamic row count), then count any later
        compile as a recompile."""
        if self.compiled is None:
            return
        for num_rows in (1, 2, 3):
            probs = torch.full((num_rows, self.vocab_size), 1.0 / self.vocab_size, device=self.device)
            keys = torch.arange(num_rows, dtype=torch.int64, device=self.device)
            self._race(probs, keys, self.noise.vocab_hashes)
        self.compiled.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return 0 if self.compiled is None else self.compiled.num_recompiles

    def sample(
        self,
        logits: torch.Tensor,
        rows: list[RowSampling],
        histories: list[tuple[list[int], list[int]]] | None = None,
    ) -> SampleOutput:
        """logits float32 [N, V] on the device; histories[i] = (prompt ids, output ids) of row i
        (needed when a row has penalties). Waits for the results."""
        return self.launch(logits, rows, histories).read()

    def launch(
        self,
        logits: torch.Tensor,
        rows: list[RowSampling],
        histories: list[tuple[list[int], list[int]]] | None = None,
    ) -> PendingSamples:
        """Queue the sampling and the copy of its results to the host; nothing waits here."""
        logits = logits[:, : self.vocab_size].float()
        raw_logprobs = (
            torch.log_softmax(logits, dim=-1) if any(r.num_logprobs is not None for r in rows) else None
        )
        if any(r.has_penalties for r in rows):
            logits = self._penalize(logits, rows, histories or [])
        token_ids = logits.argmax(dim=-1)
        if not all(r.greedy for r in rows):
            token_ids = torch.where(
                self._flags([r.greedy for r in rows]), token_ids, self._draw(logits, rows)
            )
        return self._copy_out(token_ids, raw_logprobs, rows)

    # ---- penalties -------------------------------------------------------------------------

    def _penalize(self, logits: torch.Tensor, rows: list[RowSampling], histories) -> torch.Tensor:
        num_rows, vocab = logits.shape
        outputs = self._counts(
            [h[1] if r.has_penalties else [] for r, h in zip(rows, histories, strict=True)], vocab
        )
        prompts = self._counts(
            [h[0] if r.repetition_penalty != 1.0 else [] for r, h in zip(rows, histories, strict=True)], vocab
        )
        repetition = self._column([r.repetition_penalty for r in rows])
        seen = (outputs + prompts) > 0
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)
        logits = logits - self._column([r.frequency_penalty for r in rows]) * outputs
        return logits - self._column([r.presence_penalty for r in rows]) * (outputs > 0).float()

    def _counts(self, token_lists: list[list[int]], vocab: int) -> torch.Tensor:
        """float32 [N, V]: how often each id occurs in each row's list."""
        counts = torch.zeros(len(token_lists), vocab, dtype=torch.float32, device=self.device)
        width = max((len(ids) for ids in token_lists), default=0)
        if width == 0:
            return counts
        padded = torch.full((len(token_lists), width), vocab, dtype=torch.int64)
        for row, ids in enumerate(token_lists):
            padded[row, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        index = self._to_device(padded)
        extended = torch.zeros(len(token_lists), vocab + 1, dtype=torch.float32, device=self.device)
        extended.scatter_add_(1, index, torch.ones_like(index, dtype=torch.float32))
        return extended[:, :vocab]  # column `vocab` took the padding

    # ---- random rows -----------------------------------------------------------------------

    def _draw(self, logits: torch.Tensor, rows: list[RowSampling]) -> torch.Tensor:
        temperature = self._column([1.0 if r.greedy else r.temperature for r in rows])
        probs = torch.softmax(logits / temperature, dim=-1)
        if any(r.min_p > 0 for r in rows):
            floor = self._column([r.min_p for r in rows]) * probs.max(dim=-1, keepdim=True).values
            probs = torch.where(probs < floor, torch.zeros_like(probs), probs)
        if any(r.top_k > 0 or r.top_p < 1.0 for r in rows):
            probs = self._top_k_top_p(probs, rows)
        keys = self._to_device(torch.tensor([row_key(r.seed, r.index) for r in rows], dtype=torch.int64))
        return self._race(probs, keys, self.noise.vocab_hashes)

    def _top_k_top_p(self, probs: torch.Tensor, rows: list[RowSampling]) -> torch.Tensor:
        """Zero what falls outside each row's top_k and top_p nucleus (one sort for both)."""
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        vocab = probs.shape[-1]
        ranks = torch.arange(vocab, device=self.device)[None, :]
        top_k = self._column([r.top_k if r.top_k > 0 else vocab for r in rows], torch.int64)
        keep = ranks < top_k
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the more likely tokens
        total = sorted_probs.sum(dim=-1, keepdim=True)
        keep &= before < self._column([r.top_p for r in rows]) * total
        keep[:, 0] = True  # the most likely token always stays
        filtered = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        return torch.zeros_like(probs).scatter_(-1, order, filtered)

    # ---- results ---------------------------------------------------------------------------

    def _copy_out(self, token_ids: torch.Tensor, raw_logprobs: torch.Tensor | None, rows) -> PendingSamples:
        parts = [token_ids]
        num_top = max((r.num_logprobs or 0) for r in rows) if raw_logprobs is not None else 0
        if raw_logprobs is not None:
            parts.append(raw_logprobs.gather(1, token_ids[:, None])[:, 0])
            if num_top:
                top_values, top_ids = raw_logprobs.topk(num_top, dim=-1)
                parts += [top_ids, top_values]
        return PendingSamples(
            token_ids, [_to_host(part) for part in parts], _event_after(self.device), num_top
        )

    def _column(self, values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self._to_device(torch.tensor(values, dtype=dtype)[:, None])

    def _flags(self, values: list[bool]) -> torch.Tensor:
        return self._to_device(torch.tensor(values, dtype=torch.bool))

    def _to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)
