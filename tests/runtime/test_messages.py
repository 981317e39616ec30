"""Typed messages, shared-memory tensors, and the promises about imports and pickle."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mstar.params import decode_params, encode_params
from mstar.runtime import messages as m
from mstar.runtime.shm import SegmentStore
from mstar.runtime.tensors import export_tensors, import_outputs, import_tensors
from tests.runtime.fake_models import FakeParams

REPO = Path(__file__).resolve().parents[2]
PARAMS = encode_params(FakeParams(seed=1, steps=3))

SAMPLES = [
    m.Ready(0, 1, "ipc:///tmp/x.sock"),
    m.BootFailed(1, 2, "ValueError: no"),
    m.Heartbeat(0, 1, 3),
    m.StepProgress("a", 1, 4),
    m.WalkDone("a", "generate", 1, [m.TensorRef("frames", "seg", "uint8", (1, 2, 2, 3), 12)]),
    m.RequestError("a", "boom", "worker_died"),
    m.StepStats("dit", 2, 9, 0.5),
    m.Recompiles("dit", 1),
    m.NodeEvents("text_encoder", {"prompt_cache_hits": 2}),
    m.RunWalk("a", "req", PARAMS, "encode", m.CONDUCTOR, [], True),
    m.Release("a"),
    m.Peers(["ipc:///a", ""]),
    m.Peers(["ipc:///a", "ipc:///b"], 3),
    m.PeersKnown(1, 2, 3),
    m.Shutdown(),
    m.Handoff("stage", "a", "req", PARAMS, "generate", 1, -1, 0, []),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_every_message_round_trips_through_msgpack(message):
    assert m.decode(m.encode(message)) == message


def test_params_ride_as_msgpack_and_decode_into_the_specs_struct():
    run = m.decode(m.encode(m.RunWalk("a", "req", PARAMS, "encode", m.CONDUCTOR)))
    assert decode_params(run.params, FakeParams) == FakeParams(seed=1, steps=3)


def test_params_of_another_shape_do_not_decode():
    import msgspec

    from mstar.params import VideoParams

    with pytest.raises(msgspec.ValidationError):
        decode_params(PARAMS, VideoParams)


@pytest.mark.parametrize(
    "message",
    [
        m.RequestError("a", "boom", "exploded"),
        m.Handoff("teleport", "a", "req", PARAMS, "generate", 1, -1, 0),
    ],
    ids=["failure kind", "handoff part"],
)
def test_a_value_outside_its_literal_type_does_not_decode(message):
    import msgspec

    with pytest.raises(msgspec.ValidationError):
        m.decode(m.encode(message))


def test_tensors_round_trip_through_segments_and_are_unlinked(tmp_path):
    store = SegmentStore(str(tmp_path), "t-")
    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.zeros((0, 3), np.int64),
        "c": np.arange(6, dtype=">i4")[::2],  # non-native byte order, not contiguous
    }
    refs = export_tensors(store, "r1", tensors)
    assert len(store.list_segments()) == 2  # the empty tensor needs no segment
    back = import_tensors(store, refs)  # numpy, or CPU torch tensors once torch is loaded
    for key, value in tensors.items():
        np.testing.assert_array_equal(np.asarray(back[key]), value)
    assert store.list_segments() == []


def test_bf16_travels_as_words_and_widens_for_the_api(tmp_path):
    torch = pytest.importorskip("torch")
    store = SegmentStore(str(tmp_path), "t-")
    value = torch.tensor([[1.5, -2.25], [3.0, 1e-3]], dtype=torch.bfloat16)
    refs = export_tensors(store, "r1", {"x": value})
    assert refs[0].dtype == "bfloat16" and refs[0].nbytes == 8
    back = import_tensors(store, refs)["x"]
    assert back.dtype == torch.bfloat16 and torch.equal(back, value)
    refs = export_tensors(store, "r1", {"x": value})
    widened = import_outputs(store, refs)["x"]
    np.testing.assert_array_equal(widened, value.float().numpy())


def test_sweep_keeps_live_requests(tmp_path):
    store = SegmentStore(str(tmp_path), "t-")
    export_tensors(store, "live", {"a": np.ones(3)})
    export_tensors(store, "dead", {"a": np.ones(3)})
    assert store.sweep(keep_rids={"live"}) == 1
    assert len(store.list_segments()) == 1 and store.sweep() == 1


def test_runtime_imports_leave_torch_out():
    code = (
        "import sys\n"
        "import mstar.runtime.runtime, mstar.runtime.worker, mstar.runtime.conductor, mstar.runtime.step_loop\n"
        "import mstar.runtime.shm, mstar.runtime.tensors, mstar.runtime.transport, mstar.runtime.messages\n"
        "print(','.join(m for m in ('torch', 'transformers', 'diffusers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


def test_no_pickle_anywhere_in_mstar():
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "mstar").rglob("*.py")
        if "pickle" in path.read_text() or "torch.save(" in path.read_text()
    ]
    assert offenders == []
