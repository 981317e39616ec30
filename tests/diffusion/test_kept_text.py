"""Text work a request keeps across its steps, under the DiT node's byte budget: kept while there is
room, recomputed each step (the same bytes) past it, freed at the request's last step and when it
ends for any other reason."""

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseNode, kept_per_label
from mstar.diffusion.kept import KeptText, value_bytes
from mstar.graph import RequestState

from .test_denoise import Params, RecordingPipeline

ONE_TEXT_BYTES = 4 * 4  # the float32 [4] each label's text work makes below


class KeepingPipeline(RecordingPipeline):
    """Each item's output reads its text work, kept per label through kept_per_label."""

    def __init__(self):
        super().__init__()
        self.computed: list[tuple[str, str]] = []

    def predict(self, items):
        outputs = []
        for item in items:
            work = kept_per_label(item, "work", lambda item=item: self._text_work(item))
            outputs.append(torch.tanh(item.latents) * work.sum() + item.timestep / 1000)
        return outputs

    def _text_work(self, item):
        self.computed.append((item.request_id, item.label))
        return torch.full((4,), float(item.text))


def _request(request_id, steps, guidance=1.0, seed=0):
    return RequestState(request_id, Params(steps=steps, guidance=guidance, seed=seed))


def _run(node, requests):
    for request in requests:
        node.prepare(request)
    while any(not node.check_stop(request) for request in requests):
        node.forward([request for request in requests if not node.check_stop(request)])


def test_value_bytes_counts_nested_tensors():
    value = [(torch.zeros(2, 3), torch.zeros(5, dtype=torch.bfloat16)), {"a": torch.zeros(1)}, "text"]
    assert value_bytes(value) == 6 * 4 + 5 * 2 + 4


def test_past_the_budget_text_work_is_recomputed_each_step_and_gives_the_same_latents():
    # Room for one label's text work: the first request keeps its, the second recomputes at each
    # step until the first finishes, then keeps its own.
    pipeline = KeepingPipeline()
    kept = KeptText(max_bytes=ONE_TEXT_BYTES)
    node = DenoiseNode(pipeline, kept=kept)
    first, second = _request("a", steps=2, seed=1), _request("b", steps=5, seed=2)
    _run(node, [first, second])
    assert pipeline.computed == [("a", COND), ("b", COND), ("b", COND), ("b", COND)]
    assert kept.num_refused == 2 and node.event_counts()["kept_text_refused"] == 2
    assert kept.num_bytes == 0  # both finished: nothing is held

    unbounded = KeepingPipeline()
    reference = [_request("a", steps=2, seed=1), _request("b", steps=5, seed=2)]
    _run(DenoiseNode(unbounded), reference)
    assert unbounded.computed == [("a", COND), ("b", COND)]
    for got, want in zip((first, second), reference, strict=True):
        assert torch.equal(got.tensors["latents"], want.tensors["latents"])


def test_kept_work_is_freed_at_the_last_step_and_on_release():
    pipeline = KeepingPipeline()
    kept = KeptText(max_bytes=None)
    node = DenoiseNode(pipeline, kept=kept)
    done, dropped = _request("a", steps=1, guidance=5.0), _request("b", steps=4, guidance=5.0)
    for request in (done, dropped):
        node.prepare(request)
    node.forward([done, dropped])
    assert node.check_stop(done)
    assert "work" not in done.state[node.name].condition  # freed at its last step
    assert sorted(dropped.state[node.name].condition["work"]) == [COND, UNCOND]
    assert kept.num_bytes == 2 * ONE_TEXT_BYTES
    node.release(dropped)  # cancelled, failed or timed out: the node lets go of it
    assert kept.num_bytes == 0
    node.release(done)
    assert kept.num_bytes == 0


def test_a_zero_budget_keeps_nothing():
    pipeline = KeepingPipeline()
    node = DenoiseNode(pipeline, kept=KeptText(max_bytes=0))
    request = _request("a", steps=3)
    _run(node, [request])
    assert pipeline.computed == [("a", COND)] * 3
