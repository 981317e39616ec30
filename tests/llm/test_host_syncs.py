"""A decode step reads the device back once: the sampled ids (PendingSamples.read), nothing else.
Every other read of a device tensor on the host (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`) would
stall the host on a GPU until the device ran everything queued, so the next step could not be
planned while this one runs. Counted on CPU, where the same code runs."""

from __future__ import annotations

import pytest
import torch

from mstar.graph import RequestState
from mstar.llm.sampling import PendingSamples
from tests.llm.engine import make_node, request, tiny_model

HOST_READS = ("item", "tolist", "cpu", "numpy")
NUM_STEPS = 12


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_model(dtype=torch.float32)
    torch.set_num_threads(threads)


class ReadCounter:
    """Counts host reads of tensors made by the node's code (the model, sampler and runner), and
    those inside PendingSamples.read apart."""

    def __init__(self, monkeypatch):
        self.outside, self.reads, self._inside = [], 0, False
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, original))
        read = PendingSamples.read

        def counted_read(pending):
            self.reads += 1
            self._inside = True
            try:
                return read(pending)
            finally:
                self._inside = False

        monkeypatch.setattr(PendingSamples, "read", counted_read)

    def _counted(self, name, original):
        def method(tensor, *args, **kwargs):
            if not self._inside:
                self.outside.append(name)
            return original(tensor, *args, **kwargs)

        return method


@pytest.mark.parametrize("overlap, device_done", [(False, False), (True, False), (True, True)])
def test_each_decode_step_reads_the_device_back_once(model, monkeypatch, overlap, device_done):
    """device_done: the device has finished each step by the next forward (a host-bound step), so
    overlap reads it back before queueing the next."""
    monkeypatch.setattr(PendingSamples, "done", lambda pending: device_done)
    node = make_node(model, dtype=torch.float32, overlap=overlap)
    states = [RequestState(f"r{i}", request([5 + i, 9, 13, 2], max_tokens=NUM_STEPS + 4)) for i in range(3)]
    for state in states:
        state.emit_output = lambda key, piece: None
        node.prepare(state)
    for _ in range(2):  # the prefill step, then the first decode step (overlap reads the prefill then)
        node.forward(states)
    counter = ReadCounter(monkeypatch)
    for _ in range(NUM_STEPS):
        node.forward(states)
    assert counter.reads == NUM_STEPS  # one read-back of the sampled ids per step, batched over rows
    assert counter.outside == []  # and no other host read anywhere on the step's path
