"""Out-of-memory in a step: recognise it and give the freed memory back to the device.

A step that runs out of device memory fails only its own batch (kind "out_of_memory"); once that
batch's tensors are dropped, the caching allocator's blocks are returned so the next step starts
from the boot-time footprint instead of a fragmented pool. Torch is never imported here: a worker
without torch has no device memory to free.
"""

from __future__ import annotations

import sys

from mstar.errors import FailureKind

OUT_OF_MEMORY_KIND: FailureKind = "out_of_memory"


def is_out_of_memory(error: BaseException) -> bool:
    """torch.OutOfMemoryError (torch.cuda.OutOfMemoryError), or an allocator RuntimeError saying so
    (other backends and older builds raise a plain RuntimeError "... out of memory ...")."""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def release_cached_memory() -> None:
    """Return cached device blocks to the driver (after the failed batch's tensors are gone)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    import gc

    gc.collect()  # tensors held only by reference cycles of the failed step's frames
    torch.cuda.empty_cache()


def take_peak_allocated_bytes() -> int:
    """Most bytes this process's tensors held on its GPUs since the previous call (the allocator's
    peak, then reset): torch.cuda.max_memory_allocated, the figure diffusers' benchmarks report.
    0 where CUDA is not in use. Safe from any thread: the allocator guards its statistics."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0
    peak_bytes = 0
    for index in range(torch.cuda.device_count()):
        peak_bytes += torch.cuda.max_memory_allocated(index)
        torch.cuda.reset_peak_memory_stats(index)
    return peak_bytes
