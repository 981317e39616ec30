"""The worker's peak allocated GPU bytes per heartbeat (engine.memory.take_peak_allocated_bytes),
its /metrics gauge, and the benchmark's reader of that gauge."""

import io
import sys
import types

from mstar.api.metrics import PrometheusMetrics
from mstar.bench import gpu_memory
from mstar.engine.memory import take_peak_allocated_bytes


def _fake_torch(peaks: list[int], resets: list[int]) -> types.ModuleType:
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: len(peaks),
        max_memory_allocated=lambda index: peaks[index],
        reset_peak_memory_stats=resets.append,
    )
    return types.SimpleNamespace(cuda=cuda)


def test_peak_is_summed_over_devices_then_reset(monkeypatch):
    resets: list[int] = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch([3 << 30, 1 << 30], resets))
    assert take_peak_allocated_bytes() == 4 << 30
    assert resets == [0, 1]  # the next heartbeat reports only what follows


def test_no_cuda_in_use_reports_zero(monkeypatch):
    torch = _fake_torch([5], [])
    torch.cuda.is_initialized = lambda: False  # a CPU worker never initialises CUDA
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert take_peak_allocated_bytes() == 0


def test_reader_sums_the_workers_gauges(monkeypatch):
    metrics = PrometheusMetrics("m")
    metrics.observe_gpu_memory(0, 2 << 30)
    metrics.observe_gpu_memory(1, 3 << 30)
    text = metrics.render()
    monkeypatch.setattr("urllib.request.urlopen", lambda url, timeout: io.BytesIO(text))
    source, read = gpu_memory.metrics_allocated_reader("http://server:8000/")
    assert read() == 5 << 30 and "max_memory_allocated" in source
