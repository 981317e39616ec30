"""A step's inputs go to the device in one staged copy: the views of it are the packed input ids,
positions, the sampling rows' last tokens and the fed tokens' places, as the plan gives them."""

from __future__ import annotations

import torch

from mstar.llm.runner import Feed, StagedInputs
from mstar.llm.scheduler import Row, StepPlan
from mstar.llm.sequence import PENDING, Sequence


def _seq(seq_id: str, tokens: list[int], num_prompt: int, pages: list[int]) -> Sequence:
    seq = Sequence(seq_id, tokens, num_prompt, arrival=0)
    seq.pages = pages
    return seq


class _Source:  # the step in flight's samples: only their device copy is read
    token_ids = torch.tensor([70, 71])


def test_one_copy_holds_every_input_of_a_mixed_step():
    decode = _seq("d", [5, 6, 7, PENDING], 3, [0])  # its last token still on the device
    prefill = _seq("p", [1, 2, 3, 4, 9, 8], 6, [1, 2])  # a chunk of 4 after 2 computed: samples
    chunk = _seq("c", [3] * 10, 10, [3, 4, 5])  # 5 of 10: does not sample yet
    plan = StepPlan([Row(decode, 3, 1), Row(prefill, 2, 4), Row(chunk, 0, 5)], num_decode=1)
    layout = plan.layout(4)
    feed = Feed(positions=[0], source=_Source(), indices=[1])
    staged = StagedInputs.of(plan, layout, [0, 1], feed, torch.device("cpu"))
    assert staged.input_ids.tolist() == [PENDING, 3, 4, 9, 8, 3, 3, 3, 3, 3]
    assert staged.positions.tolist() == [3, 2, 3, 4, 5, 0, 1, 2, 3, 4]
    assert staged.last_tokens.tolist() == [0, 4] and staged.num_sampled == 2
    assert staged.feed_positions.tolist() == [0] and staged.feed_indices.tolist() == [1]
    assert {t.dtype for t in (staged.input_ids, staged.positions, staged.last_tokens)} == {torch.int64}


def test_a_decode_step_where_every_row_samples_needs_no_index():
    seqs = [_seq(name, [4, 5, 6], 2, [index]) for index, name in enumerate("ab")]
    plan = StepPlan([Row(seq, 2, 1) for seq in seqs], num_decode=2)
    staged = StagedInputs.of(plan, plan.layout(4), [0, 1], None, torch.device("cpu"))
    assert staged.input_ids.tolist() == [6, 6] and staged.positions.tolist() == [2, 2]
    assert staged.last_tokens is None and staged.feed_positions is None and staged.num_sampled == 2
