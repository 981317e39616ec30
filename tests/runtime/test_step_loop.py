"""Walk semantics and batching in one worker's step loop, in-process (no subprocesses)."""

import numpy as np
import pytest
import zmq

from mstar.params import encode_params
from mstar.runtime import messages as m
from mstar.runtime.shm import SegmentStore
from mstar.runtime.step_loop import StepLoop
from mstar.runtime.tensors import export_tensors, import_outputs
from mstar.runtime.transport import Outboxes
from tests.runtime.fake_models import NODE_CLASSES, FakeParams, FakeSpec, expected_frame_value


@pytest.fixture
def store(tmp_path):
    return SegmentStore(str(tmp_path), "test-")


@pytest.fixture
def sent():
    return []


@pytest.fixture
def loop(store, sent):
    spec = FakeSpec()
    nodes = {name: cls() for name, cls in NODE_CLASSES.items()}
    owner = dict.fromkeys(spec.node_names, 0)
    context = zmq.Context()
    yield StepLoop(0, spec, nodes, owner, store, sent.append, Outboxes(context))
    context.destroy(linger=0)


def run_until_idle(loop, max_rounds=100):
    for _ in range(max_rounds):
        if not loop.has_work():
            return
        loop.run_round(lambda: None)
    raise AssertionError("step loop did not go idle")


def start_generate(loop, store, rid, **params):
    """Enter the request at the denoise loop directly, with the encode walk's outputs as inputs."""
    seed = params.setdefault("seed", 1)
    tensors = {"embeds": np.full(4, seed, np.float32), "aux": np.arange(3, dtype=np.float32) * seed}
    refs = export_tensors(store, rid, tensors)
    loop.handle(
        m.RunWalk(rid, f"req-{rid}", encode_params(FakeParams(**params)), "generate", m.CONDUCTOR, refs)
    )


def outputs_of(sent, store, rid):
    """The final walk's outputs as the conductor assembles them (pieces joined per key)."""
    done = [msg for msg in sent if isinstance(msg, m.WalkDone) and msg.rid == rid and msg.outputs]
    assert len(done) == 1, f"{rid}: {sent}"
    outputs = import_outputs(store, done[0].outputs)
    pieces = [msg.piece for msg in sent if isinstance(msg, m.OutputPiece) and msg.rid == rid]
    for key in {ref.key for ref in pieces}:
        outputs[key] = np.concatenate([import_outputs(store, [ref])[key] for ref in pieces if ref.key == key])
    return outputs


def errors(sent):
    return {msg.rid: msg.message for msg in sent if isinstance(msg, m.RequestError)}


def test_walks_run_in_order_and_keep_only_declared_outputs(loop, store, sent):
    loop.handle(m.RunWalk("a", "req-a", encode_params(FakeParams(seed=2, steps=3)), "encode", next_worker=0))
    run_until_idle(loop)
    assert [type(msg) for msg in sent if not isinstance(msg, m.StepStats)] == [m.WalkDone]
    assert set(loop.table.get("a").state.tensors) == {"embeds", "aux"}

    loop.handle(m.RunWalk("a", "req-a", encode_params(FakeParams(seed=2, steps=3)), "generate", m.CONDUCTOR))
    run_until_idle(loop)
    outputs = outputs_of(sent, store, "a")
    assert set(outputs) == {"frames", "batch_sizes"}  # "latents" was not a declared output
    assert outputs["frames"].dtype == np.uint8 and outputs["frames"].shape == (1, 2, 2, 3)
    assert int(outputs["frames"][0, 0, 0, 0]) == expected_frame_value(2, 3)
    progress = [(msg.step, msg.total) for msg in sent if isinstance(msg, m.StepProgress)]
    assert progress == [(1, 3), (2, 3), (3, 3)]
    assert store.list_segments() == []


def test_requests_join_and_leave_the_loop_between_steps(loop, store, sent):
    start_generate(loop, store, "long", steps=6)
    loop.run_round(lambda: None)
    loop.run_round(lambda: None)
    start_generate(loop, store, "short", steps=2)
    run_until_idle(loop)
    assert outputs_of(sent, store, "long")["batch_sizes"].tolist() == [1, 1, 2, 2, 1, 1]
    assert outputs_of(sent, store, "short")["batch_sizes"].tolist() == [2, 2]


def test_steps_of_boot_warmup_requests_are_marked_for_the_conductor_to_leave_out(loop, store, sent):
    seed_tensors = {"embeds": np.full(4, 1, np.float32), "aux": np.arange(3, dtype=np.float32)}
    refs = export_tensors(store, "w", seed_tensors)
    params = encode_params(FakeParams(seed=1, steps=2))
    loop.handle(m.RunWalk("w", "warmup-0", params, "generate", m.CONDUCTOR, refs, warmup=True))
    run_until_idle(loop)
    start_generate(loop, store, "a", steps=2)
    run_until_idle(loop)
    marks = [s.warmup for s in sent if isinstance(s, m.StepStats) and s.node == "denoiser"]
    assert marks == [True, True, False, False]  # the conductor drops the first two from /metrics


def test_batch_key_separates_requests(loop, store, sent):
    start_generate(loop, store, "a", steps=3, key="x")
    start_generate(loop, store, "b", steps=3, key="y")
    start_generate(loop, store, "c", steps=3, key="x")
    run_until_idle(loop)
    sizes = {rid: outputs_of(sent, store, rid)["batch_sizes"].tolist() for rid in "abc"}
    assert sizes == {"a": [2, 2, 2], "b": [1, 1, 1], "c": [2, 2, 2]}


def test_batches_are_capped_by_size_and_cost(loop, store, sent):
    for index in range(6):
        start_generate(loop, store, f"r{index}", steps=1)
    start_generate(loop, store, "big1", steps=1, key="costly", cost=5)
    start_generate(loop, store, "big2", steps=1, key="costly", cost=5)
    run_until_idle(loop)
    stats = [(s.batch_size, s.cost) for s in sent if isinstance(s, m.StepStats) and s.node == "denoiser"]
    assert sorted(stats) == [(1, 5), (1, 5), (2, 2), (4, 4)]  # max_batch_size 4, max_step_cost 8


def test_one_failing_request_leaves_its_batch_mates_running(loop, store, sent):
    start_generate(loop, store, "bad", steps=5, fail="denoiser.stop")
    start_generate(loop, store, "good", steps=5)
    run_until_idle(loop)
    assert "stop rule broke" in errors(sent)["bad"]
    assert outputs_of(sent, store, "good")["batch_sizes"].tolist() == [2, 2, 1, 1, 1]
    assert loop.table.rids() == ["good"]  # "bad" was dropped with its state


def test_forward_failure_fails_only_that_batch(loop, store, sent):
    start_generate(loop, store, "boom", steps=3, key="k1", fail="denoiser.forward")
    start_generate(loop, store, "fine", steps=3, key="k2")
    run_until_idle(loop)
    assert "kernel exploded" in errors(sent)["boom"]
    assert int(outputs_of(sent, store, "fine")["frames"][0, 0, 0, 0]) == expected_frame_value(1, 3)


def test_release_mid_loop_drops_state_and_late_messages(loop, store, sent):
    start_generate(loop, store, "a", steps=50)
    loop.run_round(lambda: None)
    request = loop.table.get("a")
    assert request.state.state["denoiser"]["step"] == 1
    loop.handle(m.Release("a"))
    assert not loop.has_work() and len(loop.table) == 0
    assert request.state.state == {} and request.state.tensors == {}
    start_generate(loop, store, "a", steps=1)  # a straggler for an ended request is dropped
    assert len(loop.table) == 0 and store.list_segments() == []


def test_node_event_counts_are_reported_as_increases(loop, sent):
    encoder = loop.queues["encoder"].node
    totals = {"cache_hits": 0, "cache_misses": 0}
    encoder.event_counts = lambda: dict(totals)
    for rid, (hits, misses) in zip("abc", [(0, 2), (0, 2), (3, 2)], strict=True):
        totals.update(cache_hits=hits, cache_misses=misses)
        loop.handle(
            m.RunWalk(rid, f"req-{rid}", encode_params(FakeParams(seed=1, steps=1)), "encode", next_worker=0)
        )
        run_until_idle(loop)
    events = [(msg.node, msg.increments) for msg in sent if isinstance(msg, m.NodeEvents)]
    assert events == [("encoder", {"cache_misses": 2}), ("encoder", {"cache_hits": 3})]


def test_a_failing_event_count_reports_nothing(loop, sent):
    def broken():
        raise RuntimeError("counter unavailable")

    loop.queues["encoder"].node.event_counts = broken
    loop.handle(m.RunWalk("a", "req-a", encode_params(FakeParams(seed=1, steps=1)), "encode", next_worker=0))
    run_until_idle(loop)
    assert not [msg for msg in sent if isinstance(msg, m.NodeEvents)]
    assert not errors(sent)


def test_the_final_walks_last_stage_sends_pieces_before_the_walk_done(loop, store, sent):
    start_generate(loop, store, "clip", steps=2, num_frames=3)
    run_until_idle(loop)
    messages = [msg for msg in sent if isinstance(msg, m.OutputPiece | m.WalkDone)]
    assert [type(msg) for msg in messages] == [m.OutputPiece] * 3 + [m.WalkDone]
    assert [msg.index for msg in messages[:3]] == [0, 1, 2]
    done = messages[-1]
    assert done.num_pieces == {"frames": 3}
    assert [ref.key for ref in done.outputs] == ["batch_sizes"]  # the frames went ahead in pieces
    pieces = [import_outputs(store, [msg.piece])["frames"] for msg in messages[:3]]
    first = expected_frame_value(1, 2)
    assert [int(piece[0, 0, 0, 0]) for piece in pieces] == [first, first + 1, first + 2]
    import_outputs(store, done.outputs)
    assert store.list_segments() == []


def test_a_walk_that_is_not_the_last_keeps_its_outputs_whole(loop, store, sent):
    seed = 1
    tensors = {"embeds": np.full(4, seed, np.float32), "aux": np.arange(3, dtype=np.float32) * seed}
    refs = export_tensors(store, "mid", tensors)
    loop.handle(
        m.RunWalk("mid", "req-mid", encode_params(FakeParams(seed=seed, num_frames=3)), "generate", 0, refs)
    )
    run_until_idle(loop)
    assert not [msg for msg in sent if isinstance(msg, m.OutputPiece)]
    assert loop.table.get("mid").state.tensors["frames"].shape == (3, 2, 2, 3)
    assert loop.table.get("mid").state.emit_output is None


def test_a_request_not_ready_waits_and_a_failing_readiness_fails_it_alone(loop, store, sent):
    """The node's readiness hook (a LoRA adapter loading, or one that cannot be loaded)."""
    gate = {"loading": False}
    denoiser = loop.queues["denoiser"].node

    def ready(request):
        if request.request_id == "req-broken":
            raise RuntimeError("adapter 'x' could not be loaded: bad file")
        return request.request_id != "req-loading" or gate["loading"]

    denoiser.ready = ready
    start_generate(loop, store, "loading", steps=2)
    start_generate(loop, store, "broken", steps=2)
    start_generate(loop, store, "fine", steps=2)
    run_until_idle(loop)
    assert "could not be loaded: bad file" in errors(sent)["broken"]
    assert outputs_of(sent, store, "fine")["batch_sizes"].tolist() == [1, 1]
    assert not loop.has_work() and "loading" in loop.table.rids()  # it waits, the loop idles
    gate["loading"] = True
    run_until_idle(loop)
    assert outputs_of(sent, store, "loading")["batch_sizes"].tolist() == [1, 1]
