"""The adapter store: loads on its own thread while the caller goes on, makes requests ready in
slots (LRU, never evicting what a ready request uses), and a corrupt file fails only the requests
that name it, with the reason."""

import threading
import time

import pytest
import torch
from torch import nn

from mstar.adapters import LoraCatalog, LoraKeyRules
from mstar.engine.lora import store as store_module
from mstar.engine.lora.linear import LoraRows
from mstar.engine.lora.store import AdapterStore, resident_adapter_names
from mstar.engine.lora.wrap import LoraLayers, linear_targets
from mstar.params import LoraChoice
from tests.lora_files import write_adapter

IN, OUT = 16, 8
RULES = LoraKeyRules(family="test")
TIMEOUT_S = 30.0


def _tensors(seed, rank=4):
    generator = torch.Generator().manual_seed(seed)
    return {
        "transformer.proj.lora_A.weight": torch.randn(rank, IN, generator=generator),
        "transformer.proj.lora_B.weight": torch.randn(OUT, rank, generator=generator),
    }


@pytest.fixture
def setup(tmp_path):
    for index, name in enumerate(("a", "b", "c")):
        write_adapter(str(tmp_path / f"{name}.safetensors"), _tensors(index))
    model = nn.Module()
    model.proj = nn.Linear(IN, OUT)
    layers = LoraLayers(model, linear_targets(model), num_slots=2, max_rank=8)
    loaded = threading.Event()
    store = AdapterStore(LoraCatalog(str(tmp_path)), layers, RULES, on_loaded=loaded.set)
    yield store, model, tmp_path, loaded
    store.close()


def _wait_ready(store, request_id):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        store.poll()
        status = store.status(request_id)
        if status.ready or status.failed:
            return status
        time.sleep(0.01)
    raise AssertionError(f"{request_id} never became ready")


def test_loads_on_its_thread_while_the_caller_goes_on(setup, monkeypatch):
    store, model, _, loaded = setup
    gate, threads = threading.Event(), []
    real_load = store_module.load_adapter

    def gated_load(*args):
        threads.append(threading.current_thread().name)
        assert gate.wait(TIMEOUT_S)
        return real_load(*args)

    monkeypatch.setattr(store_module, "load_adapter", gated_load)
    store.acquire("r1", [LoraChoice("a", 0.5)])  # returns while the file is still being read
    store.poll()
    assert not store.status("r1").ready
    gate.set()
    assert _wait_ready(store, "r1").ready
    assert loaded.is_set() and threads == ["lora-loader"]
    rows = LoraRows.build([3], [store.adapters("r1")], "cpu", torch.float32)
    model.proj.lora_context.set("tokens", rows)
    x = torch.randn(3, IN)
    tensors = _tensors(0)
    expected = nn.functional.linear(x, model.proj.weight, model.proj.bias)
    expected = (
        expected
        + 0.5 * x @ (tensors["transformer.proj.lora_B.weight"] @ tensors["transformer.proj.lora_A.weight"]).T
    )
    with torch.no_grad():
        torch.testing.assert_close(model.proj(x), expected, rtol=1e-5, atol=1e-5)
    assert "a" in resident_adapter_names()


def test_corrupt_file_fails_only_its_requests(setup):
    store, _, folder, _ = setup
    bad = _tensors(5)
    bad["transformer.proj.lora_B.weight"] = torch.randn(OUT, 3)  # rank 3 against A's 4
    write_adapter(str(folder / "broken.safetensors"), bad)
    (folder / "garbage.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    store.acquire("bad", [LoraChoice("broken")])
    store.acquire("good", [LoraChoice("b")])
    store.acquire("garbage", [LoraChoice("garbage")])
    assert "not valid JSON" in store.status("garbage").error
    failed = _wait_ready(store, "bad")
    assert failed.failed and "broken" in failed.error and "not a LoRA pair" in failed.error
    assert _wait_ready(store, "good").ready
    store.acquire("again", [LoraChoice("broken"), LoraChoice("b")])
    assert store.status("again").failed  # the failure is kept for this version of the file
    assert store.stats.failures == 1
    store.acquire("after", [LoraChoice("c")])
    assert _wait_ready(store, "after").ready  # the store goes on


def test_lru_evicts_only_what_no_ready_request_uses(setup):
    store, _, _, _ = setup
    store.acquire("r1", [LoraChoice("a")])
    store.acquire("r2", [LoraChoice("b")])
    assert _wait_ready(store, "r1").ready and _wait_ready(store, "r2").ready
    ((slot_of_a, _),) = store.adapters("r1")
    store.acquire("r3", [LoraChoice("c")])  # two slots, both in use: waits
    deadline = time.monotonic() + TIMEOUT_S
    while store.stats.loads < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    store.poll()
    assert not store.status("r3").ready
    store.release("r1")
    assert _wait_ready(store, "r3").ready
    assert store.resident_names() == ["b", "c"] and store.stats.evictions == 1
    assert store.adapters("r3") == [(slot_of_a, 1.0)]  # c took a's slot
    store.release("r2")
    store.acquire("r4", [LoraChoice("b")])  # still resident: ready without a load
    assert store.status("r4").ready and store.stats.loads == 3


def test_replaced_file_is_a_new_adapter(setup):
    store, _, folder, _ = setup
    store.acquire("r1", [LoraChoice("a")])
    assert _wait_ready(store, "r1").ready
    store.release("r1")
    time.sleep(0.01)
    write_adapter(str(folder / "a.safetensors"), _tensors(9, rank=8))
    store.acquire("r2", [LoraChoice("a")])
    assert _wait_ready(store, "r2").ready and store.stats.loads == 2
