"""Peak GPU memory of a whole device while a benchmark runs (the server is another process).

Reads NVML through nvidia-ml-py (`pynvml`) when importable, else `nvidia-smi`, else reports None.
`metrics_allocated_reader` reads what our server's tensors held instead (its /metrics gauge of
torch.cuda.max_memory_allocated per heartbeat): the figure diffusers' benchmarks report.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable

MIB = 1024 * 1024
ALLOCATED_METRIC = "mstar:gpu_memory_peak_allocated_bytes"


def _nvml_reader() -> Callable[[], int] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # NVML present but no driver/GPU: fall through to the next reader
        return None

    def read_used_bytes() -> int:
        return max(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)

    return read_used_bytes if handles else None


def _nvidia_smi_reader() -> Callable[[], int] | None:
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    command = [executable, "--query-gpu=memory.used", "--format=csv,noheader,nounits"]

    def read_used_bytes() -> int:
        lines = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout.split()
        return max(int(float(line)) for line in lines) * MIB  # nvidia-smi reports MiB

    try:
        read_used_bytes()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return read_used_bytes


def metrics_allocated_reader(base_url: str) -> tuple[str, Callable[[], int]]:
    """(source name, reader of the server's allocated-peak gauge summed over its workers, in
    bytes). The reader raises when the server exports no such gauge (another server), so a poller
    records nothing. /metrics needs no API key."""
    import urllib.request

    url = base_url.rstrip("/") + "/metrics"

    def read_allocated_bytes() -> int:
        with urllib.request.urlopen(url, timeout=2) as response:
            lines = response.read().decode().splitlines()
        values = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(ALLOCATED_METRIC + "{")]
        if not values:
            raise LookupError(f"{url} exports no {ALLOCATED_METRIC}")
        return int(sum(values))

    return "torch max_memory_allocated (/metrics)", read_allocated_bytes


def memory_reader() -> tuple[str, Callable[[], int]] | None:
    """(source name, reader of the most memory used on any GPU, in bytes), or None without a GPU."""
    for name, make in (("nvml", _nvml_reader), ("nvidia-smi", _nvidia_smi_reader)):
        reader = make()
        if reader is not None:
            return name, reader
    return None


class PeakMemoryPoller:
    """Polls in a thread (independent of the asyncio loop) and keeps the peak; use as a context."""

    def __init__(self, interval_s: float = 0.2, reader: tuple[str, Callable[[], int]] | None | str = "auto"):
        found = memory_reader() if reader == "auto" else reader
        self.source: str | None = found[0] if found else None
        self._read = found[1] if found else None
        self.interval_s = interval_s
        self.peak_bytes: int | None = None
        self.window_peak_bytes: int | None = None  # since the last start_window()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        try:
            used = self._read()
        except Exception:  # a failed sample must not end the benchmark
            return
        self.peak_bytes = used if self.peak_bytes is None else max(self.peak_bytes, used)
        self.window_peak_bytes = used if self.window_peak_bytes is None else max(self.window_peak_bytes, used)

    def start_window(self) -> None:
        """Start a new window (e.g. one benchmark phase): window_peak_gib covers only what follows."""
        self.window_peak_bytes = None
        if self._read is not None:
            self._sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PeakMemoryPoller:
        if self._read is not None:
            self._sample()
            self._thread = threading.Thread(target=self._loop, name="gpu-memory-poller", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    @property
    def peak_gib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / (1024 * MIB)

    @property
    def window_peak_gib(self) -> float | None:
        return None if self.window_peak_bytes is None else self.window_peak_bytes / (1024 * MIB)
