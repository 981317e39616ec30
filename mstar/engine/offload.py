"""Block weights kept in host memory and streamed to the GPU one block ahead of the compute.

A text encoder runs once per prompt, then sits idle while the DiT denoises for many steps. UMT5-XXL
(24 identical blocks, ~386 MB each in bf16, ~9 GiB in all) would hold that memory on the GPU the
whole time. `StreamedBlocks` keeps a stack of identical blocks' weights in (pinned) host memory and
copies each block into one of a few preallocated device slots just before it runs; the copy of
block i+1, on a side stream, overlaps the compute of block i. The device holds `num_slots` blocks.

Cost: every forward moves all blocks' weights over PCIe (bytes per forward = `host_bytes`, ~9 GiB
for UMT5-XXL, ~0.2 s at ~50 GB/s), so a forward is bound by host -> device bandwidth whenever a
block computes faster than it copies (short prompts).

Weights are swapped in by assigning `tensor.data`, so parameters keep their identity and the blocks'
code is unchanged; autograd does not see the swap: inference only. Wrap after the model has its
final device and dtype: a later `model.to(...)` would not reach the host copies, which are the truth.
"""

from __future__ import annotations

from functools import partial
from itertools import zip_longest

import torch
from torch import nn

# (name, shape, dtype) of each parameter and buffer of a block, in a fixed order.
_Layout = list[tuple[str, tuple[int, ...], torch.dtype]]


def _named_tensors(block: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*block.named_parameters(recurse=True), *block.named_buffers(recurse=True)]


def _layout(block: nn.Module) -> _Layout:
    return [(name, tuple(tensor.shape), tensor.dtype) for name, tensor in _named_tensors(block)]


def _check_same_layout(blocks: list[nn.Module]) -> None:
    """One set of slots serves every block, so every block must have block 0's tensors."""
    expected = _layout(blocks[0])
    for index, block in enumerate(blocks[1:], start=1):
        for found, wanted in zip_longest(_layout(block), expected):
            if found != wanted:
                name = (found or wanted)[0]
                raise ValueError(f"block {index} differs from block 0 at {name!r}: {found} vs {wanted}")


# The pinned-memory allocator rounds each allocation up to a power of two (an 80 MiB UMT5-XXL
# weight would take 128 MiB), so the host copies are packed into chunks of this size instead.
_CHUNK_BYTES = 256 << 20
_ALIGN_BYTES = 512  # of each tensor inside a chunk: a multiple of every dtype's size


def _pack(sizes_bytes: list[int], chunk_bytes: int = _CHUNK_BYTES) -> tuple[list[int], list[tuple[int, int]]]:
    """First-fit decreasing: each chunk's used bytes, and each size's (chunk, offset in bytes).

    A size over `chunk_bytes` gets a chunk of its own.
    """
    used_bytes: list[int] = []
    places = [(0, 0)] * len(sizes_bytes)
    for index in sorted(range(len(sizes_bytes)), key=lambda i: -sizes_bytes[i]):
        size_bytes = -(-sizes_bytes[index] // _ALIGN_BYTES) * _ALIGN_BYTES
        fits = (chunk for chunk, used in enumerate(used_bytes) if used + size_bytes <= chunk_bytes)
        chunk = next(fits, len(used_bytes))
        if chunk == len(used_bytes):
            used_bytes.append(0)
        places[index] = (chunk, used_bytes[chunk])
        used_bytes[chunk] += size_bytes
    return used_bytes, places


def _empty_host_copies(blocks_tensors: list[list[torch.Tensor]], pin: bool) -> list[list[torch.Tensor]]:
    """Contiguous host tensors like `blocks_tensors`, packed into (pinned: DMA-able) chunks."""
    flat = [tensor for tensors in blocks_tensors for tensor in tensors]
    used_bytes, places = _pack([tensor.nbytes for tensor in flat])
    chunks = [torch.empty(size, dtype=torch.uint8, pin_memory=pin) for size in used_bytes]
    views = iter(
        chunks[chunk][offset : offset + tensor.nbytes].view(tensor.dtype).view(tensor.shape)
        for tensor, (chunk, offset) in zip(flat, places, strict=True)
    )
    return [[next(views) for _ in tensors] for tensors in blocks_tensors]


def _point(tensors: list[torch.Tensor], storages: list[torch.Tensor]) -> None:
    for tensor, storage in zip(tensors, storages, strict=True):
        tensor.data = storage


class StreamedBlocks:
    """Streams each block's weights from host memory into a device slot just before it runs.

    `blocks` run in order 0, 1, ... (as a transformer stack calls them); block i uses slot
    i % num_slots. Between forwards every block's tensors point at their host copies. Forward hooks
    are `always_call`, so a forward that raises in a block points it back at the host at once; under
    torch.compile (which skips such hooks) a block may keep pointing at its slot until the next
    forward's pre-hooks re-point it. Each forward starts at block 0, which drops prefetch state.
    """

    def __init__(self, blocks: nn.ModuleList, device: str | torch.device, num_slots: int = 2) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        if len(blocks) == 0:
            raise ValueError("no blocks to stream")
        self.device = torch.device(device)
        self.num_slots = num_slots
        self._on_cuda = self.device.type == "cuda"
        self._blocks = list(blocks)
        _check_same_layout(self._blocks)
        self._tensors = [[tensor for _, tensor in _named_tensors(block)] for block in self._blocks]
        # Outside inference mode: inference tensors cannot later serve a forward outside it.
        with torch.inference_mode(False):
            self._host = _empty_host_copies(self._tensors, pin=self._on_cuda)
            for tensors, host in zip(self._tensors, self._host, strict=True):
                for tensor, host_tensor in zip(tensors, host, strict=True):
                    host_tensor.copy_(tensor.detach())
                _point(tensors, host)  # block by block, so device memory is freed as we go
            self._slots = [
                [torch.empty(host.shape, dtype=host.dtype, device=self.device) for host in self._host[0]]
                for _ in range(num_slots)
            ]
        # Which block each slot holds once its queued copy has run; None: no block to trust.
        self._slot_block: list[int | None] = [None] * num_slots
        if self._on_cuda:
            self._copy_stream = torch.cuda.Stream(self.device)
            self._copy_done = [torch.cuda.Event() for _ in range(num_slots)]
            self._slot_free = [torch.cuda.Event() for _ in range(num_slots)]
        self._handles = []
        for index, block in enumerate(self._blocks):
            self._handles.append(block.register_forward_pre_hook(partial(self._before_block, index)))
            self._handles.append(
                block.register_forward_hook(partial(self._after_block, index), always_call=True)
            )

    @property
    def slot_bytes(self) -> int:
        """Device bytes held by the slots in total."""
        return sum(tensor.nbytes for slot in self._slots for tensor in slot)

    @property
    def host_bytes(self) -> int:
        """Bytes of the blocks' weights kept on the host (= bytes copied per forward)."""
        return sum(tensor.nbytes for host in self._host for tensor in host)

    def remove(self) -> None:
        """Removes the hooks and frees the slots; the weights stay on the host."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._on_cuda:  # a prefetch still in flight must not write into freed memory
            torch.cuda.current_stream(self.device).wait_stream(self._copy_stream)
        for tensors, host in zip(self._tensors, self._host, strict=True):
            _point(tensors, host)
        self._slots = []
        self._slot_block = []

    def _before_block(self, index: int, block: nn.Module, args: tuple) -> None:
        if index == 0:
            # A new forward: whatever an earlier forward (maybe stopped early) left is not trusted.
            self._slot_block = [None] * self.num_slots
        slot = index % self.num_slots
        if self._slot_block[slot] != index:
            self._queue_copy(index, slot)
        if self._on_cuda:
            torch.cuda.current_stream(self.device).wait_event(self._copy_done[slot])
        _point(self._tensors[index], self._slots[slot])
        # With one slot, the next block's copy must wait for this block's compute: no prefetch.
        next_index, next_slot = index + 1, (index + 1) % self.num_slots
        has_next = next_index < len(self._blocks)
        if self.num_slots > 1 and has_next and self._slot_block[next_slot] != next_index:
            self._queue_copy(next_index, next_slot)

    def _after_block(self, index: int, block: nn.Module, args: tuple, output: object) -> None:
        if self._on_cuda:
            self._slot_free[index % self.num_slots].record(torch.cuda.current_stream(self.device))
        _point(self._tensors[index], self._host[index])

    def _queue_copy(self, index: int, slot: int) -> None:
        """Queues the copy of block `index`'s weights into `slot` (on CPU: copies now)."""
        self._slot_block[slot] = None  # a copy that fails midway leaves no block to trust
        if not self._on_cuda:
            for slot_tensor, host in zip(self._slots[slot], self._host[index], strict=True):
                slot_tensor.copy_(host)
        else:
            with torch.cuda.stream(self._copy_stream):
                # The block that used this slot last must have finished reading it.
                self._copy_stream.wait_event(self._slot_free[slot])
                for slot_tensor, host in zip(self._slots[slot], self._host[index], strict=True):
                    slot_tensor.copy_(host, non_blocking=True)
                self._copy_done[slot].record(self._copy_stream)
        self._slot_block[slot] = index
