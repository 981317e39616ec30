"""The runtime end to end over two worker processes (fake numpy models, ipc transport)."""

import numpy as np
import pytest

from mstar.errors import RequestFailed
from mstar.runtime.events import Done, Failed, Piece, Progress
from mstar.runtime.runtime import Runtime
from tests.runtime.fake_models import FakeParams, FakeSpec, expected_frame_value
from tests.runtime.helpers import final_event, make_config, run, until_progress, wait_for


class RecordingMetrics:
    def __init__(self):
        self.queue_times, self.steps, self.ends, self.recompiles = [], [], [], []
        self.host_durations_s, self.gpu_memory, self.walks = [], [], []

    def observe_queue_time(self, seconds):
        self.queue_times.append(seconds)

    def observe_step(self, node, batch_size, cost, duration_s, host_duration_s=0.0):
        self.steps.append((node, batch_size, cost, duration_s))
        self.host_durations_s.append(host_duration_s)

    def observe_request_end(self, outcome, latency_s):
        self.ends.append(outcome)

    def observe_walk(self, walk, seconds):
        self.walks.append((walk, seconds))

    def observe_gpu_memory(self, worker, peak_allocated_bytes):
        self.gpu_memory.append((worker, peak_allocated_bytes))

    def count_recompile(self, node, count):
        self.recompiles.append((node, count))

    def count_node_events(self, node, increments):
        pass


@pytest.fixture(scope="module")
def runtime(loop):
    progress_calls = []
    rt = Runtime(make_config(), FakeSpec(), metrics=RecordingMetrics())
    run(loop, rt.start(on_progress=lambda label, done, total: progress_calls.append((label, done, total))))
    rt.boot_progress = progress_calls
    yield rt
    run(loop, rt.shutdown(timeout_s=2.0))


def test_boot_progress_reaches_the_start_callback(runtime):
    assert runtime.ready
    builds = sorted(entry for entry in runtime.boot_progress if entry[0].endswith(": build"))
    assert builds == [
        ("worker 0: build", 1, 2), ("worker 0: build", 2, 2), ("worker 1: build", 1, 2), ("worker 1: build", 2, 2)
    ]  # fmt: skip
    assert ("worker 1: warmup denoiser", 1, 1) in runtime.boot_progress  # each node's warmup too


def test_request_crosses_both_workers_with_tensors(loop, runtime):
    image = np.ones((2, 3), np.float32)  # adds 6 to the embeddings
    handle = runtime.submit(FakeParams(seed=5, steps=4), inputs={"image": image}, request_id="cross")
    events = run(loop, _collect(handle))
    steps = [(e.step, e.total) for e in events if isinstance(e, Progress)]
    # Progress comes from the loop's worker and Done from another one: a step's event may be
    # overtaken by the request's end, so only order and range are promised.
    assert steps and steps == sorted(set(steps)) and all(total == 4 and step <= 4 for step, total in steps)
    assert isinstance(events[-1], Done)
    frames = events[-1].outputs["frames"]
    assert frames.dtype == np.uint8 and frames.shape == (1, 2, 2, 3)
    assert int(frames[0, 0, 0, 0]) == (4 * 5 + 6 + 4) % 256


def test_requests_join_a_running_loop_and_leave_it(loop, runtime):
    long = runtime.submit(FakeParams(seed=1, steps=8, step_sleep_s=0.05))
    long_events = long.events()
    run(loop, until_progress(long_events, 2))
    short = runtime.submit(FakeParams(seed=2, steps=2, step_sleep_s=0.05))
    short_sizes = run(loop, short.result())["batch_sizes"].tolist()
    long_sizes = run(loop, long.result())["batch_sizes"].tolist()
    assert short_sizes == [2, 2]
    assert long_sizes[:2] == [1, 1] and long_sizes.count(2) == 2 and long_sizes[-1] == 1


def test_abort_mid_loop_frees_state_on_every_worker(loop, runtime, tmp_path):
    release_log = tmp_path / "releases.txt"
    params = FakeParams(seed=1, steps=500, step_sleep_s=0.01, release_log=str(release_log))
    handle = runtime.submit(params, request_id="to-abort")
    events = handle.events()
    run(loop, until_progress(events, 3))
    assert runtime.abort("to-abort") and not runtime.abort("to-abort")
    event = run(loop, final_event(events))
    assert isinstance(event, Failed) and event.kind == "aborted"

    def released_everywhere():
        lines = release_log.read_text().split() if release_log.exists() else []
        entries = {tuple(lines[i : i + 3]) for i in range(0, len(lines), 3)}
        return {node for _, node, _ in entries} == {"encoder", "aux", "denoiser"}

    run(loop, wait_for(released_everywhere))
    pids = {line.split()[0] for line in release_log.read_text().splitlines()}
    assert pids == {str(pid) for pid in runtime.worker_pids()}
    run(loop, wait_for(lambda: runtime.stats().num_worker_requests == (0, 0)))  # heartbeats report it
    assert runtime.stats().num_running == 0


def test_one_request_fails_while_its_batch_mates_finish(loop, runtime):
    bad = runtime.submit(FakeParams(seed=1, steps=5, fail="denoiser.stop", step_sleep_s=0.02))
    good = runtime.submit(FakeParams(seed=3, steps=5, step_sleep_s=0.02))
    with pytest.raises(RequestFailed, match="stop rule broke") as failure:
        run(loop, bad.result())
    assert failure.value.kind == "error"
    assert int(run(loop, good.result())["frames"][0, 0, 0, 0]) == expected_frame_value(3, 5)


def test_forward_failure_fails_only_its_batch(loop, runtime):
    boom = runtime.submit(FakeParams(seed=1, steps=3, key="k1", fail="denoiser.forward"))
    fine = runtime.submit(FakeParams(seed=2, steps=3, key="k2"))
    bad_prepare = runtime.submit(FakeParams(seed=2, fail="encoder.prepare"))
    with pytest.raises(RequestFailed, match="kernel exploded"):
        run(loop, boom.result())
    with pytest.raises(RequestFailed, match="bad prompt"):
        run(loop, bad_prepare.result())
    assert int(run(loop, fine.result())["frames"][0, 0, 0, 0]) == expected_frame_value(2, 3)


def test_deadline_fails_the_request_with_timeout(loop, runtime):
    handle = runtime.submit(FakeParams(seed=1, steps=500, step_sleep_s=0.01), timeout_s=0.5)
    event = run(loop, final_event(handle.events()))
    assert isinstance(event, Failed) and event.kind == "timeout"
    run(loop, wait_for(lambda: runtime.stats().num_worker_requests == (0, 0)))


def test_no_shared_memory_is_left_after_requests(loop, runtime):
    handles = [runtime.submit(FakeParams(seed=seed, steps=2)) for seed in range(6)]
    for seed, handle in enumerate(handles):
        assert int(run(loop, handle.result())["frames"][0, 0, 0, 0]) == expected_frame_value(seed, 2)
    assert runtime._store.list_segments() == []
    assert runtime.stats().num_running == 0 and runtime.stats().num_waiting == 0


def test_metrics_see_steps_endings_and_recompiles(loop, runtime):
    metrics = runtime.metrics
    before, walks_before = len(metrics.ends), len(metrics.walks)
    run(
        loop,
        runtime.submit(FakeParams(seed=1, steps=2, recompile=True, cost=3, step_sleep_s=0.05)).result(),
    )
    assert metrics.ends[before:] == ["completed"]
    walks = metrics.walks[walks_before:]
    assert [walk for walk, _ in walks] == ["encode", "generate"]  # each walk's time, in order
    assert walks[1][1] >= 2 * 0.05  # the generate walk holds both sleeping denoise steps
    assert metrics.recompiles == [("denoiser", 1), ("denoiser", 1)]  # one per step that recompiled
    assert ("denoiser", 1, 3) in [step[:3] for step in metrics.steps]
    assert {step[0] for step in metrics.steps} == {"encoder", "aux", "denoiser", "decoder"}
    assert all(step[3] >= 0 for step in metrics.steps) and len(metrics.queue_times) >= len(metrics.ends)
    # heartbeats carry each worker's peak allocated GPU bytes: none on a CPU worker
    run(loop, wait_for(lambda: metrics.gpu_memory))
    assert {worker for worker, _ in metrics.gpu_memory} <= {0, 1} and {b for _, b in metrics.gpu_memory} == {
        0
    }
    # CPU workers: the host time is the step's time, and it reaches the sink with every step
    assert len(metrics.host_durations_s) == len(metrics.steps) and all(
        s > 0 for s in metrics.host_durations_s
    )


async def _collect(handle):
    return [event async for event in handle.events()]


def test_frames_sent_in_pieces_reach_callers_whole_or_streamed(loop, runtime):
    first = expected_frame_value(4, 2)
    whole = run(loop, runtime.submit(FakeParams(seed=4, steps=2, num_frames=3)).result())["frames"]
    assert whole.shape == (3, 2, 2, 3)
    assert [int(frame[0, 0, 0]) for frame in whole] == [first, first + 1, first + 2]

    streamed = runtime.submit(FakeParams(seed=4, steps=2, num_frames=3), stream_outputs=("frames",))
    events = run(loop, _collect(streamed))
    pieces = [event for event in events if isinstance(event, Piece)]
    assert [(p.key, p.index, p.value.shape) for p in pieces] == [
        ("frames", i, (1, 2, 2, 3)) for i in range(3)
    ]
    np.testing.assert_array_equal(np.concatenate([p.value for p in pieces]), whole)
    assert isinstance(events[-1], Done) and set(events[-1].outputs) == {"batch_sizes"}
    assert runtime._store.list_segments() == []


@pytest.mark.parametrize("stream_outputs", [(), ("frames",)])
def test_a_failure_after_the_first_piece_fails_the_request(loop, runtime, stream_outputs):
    params = FakeParams(seed=1, steps=2, num_frames=3, fail="decoder.mid_clip")
    events = run(loop, _collect(runtime.submit(params, stream_outputs=stream_outputs)))
    kinds = [type(event) for event in events if not isinstance(event, Progress)]
    assert kinds == ([Piece] if stream_outputs else []) + [Failed]
    assert "decoder broke after the first piece" in events[-1].message
    run(loop, wait_for(lambda: runtime.stats().num_worker_requests == (0, 0)))
    assert runtime._store.list_segments() == []
    fine = run(loop, runtime.submit(FakeParams(seed=2, steps=2, num_frames=2)).result())["frames"]
    assert fine.shape == (2, 2, 2, 3)
