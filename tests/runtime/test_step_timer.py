"""StepTimer: host wall time on CPU; on CUDA, device time read from events once they completed."""

import time

import pytest

from mstar.runtime.step_timer import StepTimer


def test_cpu_steps_are_timed_by_the_host_clock_in_order():
    timer = StepTimer()
    first = timer.start()
    time.sleep(0.02)
    timer.stop(first, "a")
    second = timer.start()
    timer.stop(second, "b")
    done = timer.collect()
    assert [payload for payload, _ in done] == ["a", "b"]
    assert done[0][1] >= 0.02 and done[1][1] < 0.02
    assert timer.collect() == []  # reported once


@pytest.fixture
def cuda_matrix():
    """An 8192^2 matrix on the GPU (20 products of it take ~0.3 s on an H200)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.cuda.init()
    return torch.randn(8192, 8192, device="cuda")


@pytest.mark.gpu
def test_cuda_steps_report_device_time_without_waiting(cuda_matrix):
    import torch

    x = cuda_matrix
    timer = StepTimer()
    token = timer.start()
    for _ in range(20):
        x = x @ x / 8192**0.5
    timer.stop(token, "matmuls")
    started = time.perf_counter()
    early = timer.collect()  # the matmuls take ~0.3 s: still queued, and collect() does not wait
    assert early == [] and time.perf_counter() - started < 0.05
    torch.cuda.synchronize()
    ((payload, seconds),) = timer.collect()
    assert payload == "matmuls" and seconds > 0.05


@pytest.mark.gpu
def test_the_loop_runs_at_most_the_bound_ahead_of_the_device(cuda_matrix):
    x = cuda_matrix
    timer = StepTimer()
    for step in range(4):
        token = timer.start()
        for _ in range(5):
            x = x @ x / 8192**0.5
        timer.stop(token, step)
        timer.bound_in_flight(1)
        assert timer.num_pending <= 1
    assert [payload for payload, _ in timer.collect()][:3] == [0, 1, 2]  # step 3 may still run
