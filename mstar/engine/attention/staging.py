"""Segment offsets staged host -> device once per plan: pinned host buffer, non-blocking copy.

One stager belongs to one (label, slot) wrapper. A step never syncs the host: the copy is queued
on the current stream and every layer's kernel reads the same device buffer. The pinned buffer is
rewritten only after the copy that last read it has finished (an event recorded after the copy;
it has long finished in practice, since the slot was planned at least one step earlier).
"""

from __future__ import annotations

import torch


def should_pin(device: torch.device) -> bool:
    """Pinned host memory only helps (and only exists) for copies to a CUDA device."""
    return device.type == "cuda"


class IndexStager:
    """Holds int32 [cu_q (n+1) | cu_kv (n+1)] on the host and on the device.

    An eager stager grows its buffers when a layout has more segments. A captured stager (its
    wrapper runs inside a CUDA graph) keeps the buffers it allocated at its first plan, so their
    addresses stay valid for the graph, and refuses layouts with another segment count.
    """

    def __init__(self, device: torch.device, captured: bool = False) -> None:
        self.device = device
        self.captured = captured
        self.num_segments: int | None = None
        self.host_buffer: torch.Tensor | None = None
        self.device_buffer: torch.Tensor | None = None
        self.num_copies = 0
        self._copy_done: torch.cuda.Event | None = None

    def write_host(self, cu_q: list[int], cu_kv: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the host buffer; returns host views (cu_q, cu_kv), each int32 [n+1]."""
        num_segments = len(cu_q) - 1
        self.reserve(num_segments)
        assert self.host_buffer is not None
        self._wait_for_last_copy()
        width = num_segments + 1
        # numpy view: one memcpy instead of a tensor built per element
        self.host_buffer.numpy()[: 2 * width] = cu_q + cu_kv
        return self.host_buffer[:width], self.host_buffer[width : 2 * width]

    def reserve(self, num_segments: int) -> None:
        """Size the buffers for `num_segments` (a captured stager accepts one count only)."""
        self._ensure_capacity(num_segments)
        self.num_segments = num_segments

    def copy_to_device(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Queue the copy of the last write_host; returns device views (cu_q, cu_kv)."""
        assert self.host_buffer is not None and self.device_buffer is not None
        assert self.num_segments is not None
        width = self.num_segments + 1
        self.device_buffer[: 2 * width].copy_(self.host_buffer[: 2 * width], non_blocking=True)
        self.num_copies += 1
        self.record_host_use()
        return self.device_views()

    def device_views(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.device_buffer is not None and self.num_segments is not None
        width = self.num_segments + 1
        return self.device_buffer[:width], self.device_buffer[width : 2 * width]

    def record_host_use(self) -> None:
        """Mark the host buffer as read by work queued now (a library's own non-blocking copy)."""
        if should_pin(self.device):
            self._copy_done = torch.cuda.Event()
            self._copy_done.record(torch.cuda.current_stream(self.device))

    def _wait_for_last_copy(self) -> None:
        if self._copy_done is not None and not self._copy_done.query():
            self._copy_done.synchronize()

    def _ensure_capacity(self, num_segments: int) -> None:
        if self.captured and self.host_buffer is not None:
            if num_segments != self.num_segments:
                raise ValueError(
                    f"a CUDA-graph captured attention wrapper keeps {self.num_segments} segments; "
                    f"got a layout with {num_segments} (capture one graph per segment count)"
                )
            return
        needed = 2 * (num_segments + 1)
        if self.host_buffer is not None and self.host_buffer.numel() >= needed:
            return
        # captured: exactly the size of the first layout; eager: room to grow before reallocating
        capacity = needed if self.captured else max(needed, 2 * self._capacity_elements())
        # normal tensors even when the first plan runs under inference_mode: later plans may not
        with torch.inference_mode(False):
            self.host_buffer = torch.empty(capacity, dtype=torch.int32, pin_memory=should_pin(self.device))
            self.device_buffer = torch.empty(capacity, dtype=torch.int32, device=self.device)
        self._copy_done = None

    def _capacity_elements(self) -> int:
        return 0 if self.host_buffer is None else self.host_buffer.numel()
