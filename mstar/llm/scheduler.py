"""Continuous batching: which tokens of which sequences one engine step computes. Pure Python.

Queues in, a batch plan out (tested on any CPU, as vLLM tests its scheduler). Per step:
1. decode rows first: every running sequence with one token left gets a row (oldest first);
2. then chunked prefill under the step's token budget: running sequences part way through their
   prompt, then waiting ones in arrival order (a waiting sequence first takes the cached pages of
   its prefix); a prompt longer than what is left of the budget gets a chunk, the rest next step;
3. pages: a row takes the pages its new tokens need. When none are left, the newest running
   sequence is preempted (its pages given back, its tokens kept) and recomputed later (with the
   prefix cache, its full pages usually come straight back). A waiting sequence that does not fit
   waits; nothing ever runs out of memory.
Requests join (add) and leave (finish) between any two steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pages import PageTable
from mstar.llm.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 2048  # tokens computed in one step (decode rows + prefill chunks)

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"scheduler: max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}) >= 1, so every decode row fits a step"
            )


@dataclass(frozen=True)
class Row:
    seq: Sequence
    start: int  # tokens of the sequence in the pool before this step
    num_tokens: int  # tokens this step computes (1 for a decode row)
    epoch: int = 0  # the sequence's preemptions when planned (its pages are others' after one)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """After this step every known token is computed: the step samples the next one."""
        return self.end == self.seq.num_tokens


@dataclass
class StepPlan:
    rows: list[Row] = field(default_factory=list)  # decode rows first, then prefill chunks
    preempted: list[Sequence] = field(default_factory=list)
    num_decode: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(row.num_tokens for row in self.rows)

    def layout(self, page_tokens: int) -> PagedLayout:
        return PagedLayout.build(
            [row.num_tokens for row in self.rows],
            [row.end for row in self.rows],
            [row.seq.pages[: -(-row.end // page_tokens)] for row in self.rows],
            page_tokens,
            self.num_decode,
        )

    def input_ids(self) -> list[int]:
        return [token for row in self.rows for token in row.seq.tokens[row.start : row.end]]


@dataclass
class SchedulerStats:
    num_preemptions: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up at first admission
    prefix_cache_hits: int = 0  # of them, served from cached pages


class Scheduler:
    def __init__(self, config: SchedulerConfig, pages: PageTable):
        self.config = config
        self.pages = pages
        self.page_tokens = pages.page_tokens
        self.running: list[Sequence] = []  # arrival order
        self.waiting: list[Sequence] = []  # arrival order (preempted ones go back in place)
        self.stats = SchedulerStats()

    # ---- joining and leaving ---------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        if self.pages.pages_for(seq.num_tokens + 1) > self.pages.num_pages:
            raise ValueError(
                f"sequence {seq.seq_id}: {seq.num_tokens} tokens never fit the pool's {self.pages.num_pages} pages"
            )
        seq.status = Status.WAITING
        _insert_by_arrival(self.waiting, seq)

    def finish(self, seq: Sequence) -> None:
        """The sequence ended (stop, length, abort, failure): give its pages back."""
        if seq.status == Status.RUNNING:
            self.running.remove(seq)
        elif seq.status == Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self._free_pages(seq)
        seq.status = Status.FINISHED

    @property
    def num_sequences(self) -> int:
        return len(self.running) + len(self.waiting)

    # ---- one step --------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_num_batched_tokens
        scheduled: set[int] = set()
        for seq in [s for s in self.running if s.is_decode and not s.done_sampling]:
            if seq.status == Status.RUNNING and self._reserve(seq, seq.num_computed + 1, plan, scheduled):
                plan.rows.append(Row(seq, seq.num_computed, 1, seq.num_preemptions))
                scheduled.add(id(seq))
                budget -= 1
        plan.num_decode = len(plan.rows)
        for seq in [s for s in self.running if not s.is_decode]:
            if budget <= 0:
                break
            if seq.status != Status.RUNNING:
                continue  # preempted above
            chunk = min(seq.num_uncomputed, budget)
            if self._reserve(seq, seq.num_computed + chunk, plan, scheduled):
                plan.rows.append(Row(seq, seq.num_computed, chunk, seq.num_preemptions))
                scheduled.add(id(seq))
                budget -= chunk
        self._admit_waiting(plan, budget)
        return plan

    def _admit_waiting(self, plan: StepPlan, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending:  # preempted with a sample in flight: back once it is read
                return
            self._take_cached_prefix(seq)
            chunk = min(seq.num_uncomputed, budget)
            new_pages = self.pages.allocate(self.pages.pages_for(seq.num_computed + chunk) - len(seq.pages))
            if new_pages is None:
                self._free_pages(seq)  # the cached prefix goes back too; it waits, in order
                return
            seq.pages.extend(new_pages)
            self.waiting.pop(0)
            seq.status = Status.RUNNING
            _insert_by_arrival(self.running, seq)
            plan.rows.append(Row(seq, seq.num_computed, chunk, seq.num_preemptions))
            budget -= chunk

    def _take_cached_prefix(self, seq: Sequence) -> None:
        """A waiting sequence starts from the cached pages of its prefix (never all of its tokens:
        the last one is always computed, so the step has its logits)."""
        num_full = (seq.num_tokens - 1) // self.page_tokens
        matched = self.pages.match_prefix(seq.page_hashes(num_full, self.page_tokens))
        seq.pages = matched
        seq.num_computed = len(matched) * self.page_tokens
        if not seq.admitted:
            seq.admitted = True
            seq.num_cached_prompt = min(seq.num_computed, seq.num_prompt)
            self.stats.prefix_cache_queries += seq.num_prompt
            self.stats.prefix_cache_hits += seq.num_cached_prompt

    def _reserve(self, seq: Sequence, num_tokens: int, plan: StepPlan, scheduled: set[int]) -> bool:
        """Pages for `num_tokens` of a running sequence, preempting the newest running sequences
        not scheduled in this step (possibly `seq` itself: then False)."""
        needed = self.pages.pages_for(num_tokens) - len(seq.pages)
        while True:
            new_pages = self.pages.allocate(needed) if needed > 0 else []
            if new_pages is not None:
                seq.pages.extend(new_pages)
                return True
            victim = next((s for s in reversed(self.running) if id(s) not in scheduled), None)
            if victim is None:
                raise RuntimeError(
                    "KV pool: no page left and nothing to preempt (pool smaller than one request)"
                )
            self._preempt(victim, plan)
            if victim is seq:
                return False

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self._free_pages(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.stats.num_preemptions += 1
        _insert_by_arrival(self.waiting, seq)
        plan.preempted.append(seq)

    def _free_pages(self, seq: Sequence) -> None:
        self.pages.release(seq.pages)
        seq.pages = []
        seq.num_computed = 0

    # ---- after the step ----------------------------------------------------------------------

    def computed(self, plan: StepPlan) -> None:
        """The step ran and its tokens are known: `advance`, then `register`."""
        self.advance(plan)
        self.register(plan)

    def advance(self, plan: StepPlan) -> None:
        """The step is queued: its rows' tokens count as in the pool (the next plan follows on)."""
        for row in plan.rows:
            if row.seq.status == Status.RUNNING and row.seq.num_preemptions == row.epoch:
                row.seq.num_computed = row.end

    def register(self, plan: StepPlan) -> None:
        """Pages the step filled join the prefix cache, once the tokens in them are all known (a
        fed token is read back a step later)."""
        for row in plan.rows:
            seq = row.seq
            if seq.status != Status.RUNNING or seq.num_preemptions != row.epoch:
                continue  # ended or preempted since: those pages are not its any more
            first_new_full = row.start // self.page_tokens
            num_full = row.end // self.page_tokens
            if num_full > first_new_full:
                hashes = seq.page_hashes(num_full, self.page_tokens)
                for index in range(first_new_full, num_full):
                    self.pages.register_full(seq.pages[index], hashes[index])


def _insert_by_arrival(queue: list[Sequence], seq: Sequence) -> None:
    index = len(queue)
    while index > 0 and queue[index - 1].arrival > seq.arrival:
        index -= 1
    queue.insert(index, seq)
