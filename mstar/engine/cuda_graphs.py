"""CUDA graphs for launch-bound functions of one token sequence, one graph per length bucket.

A text encoder's forward over one short prompt is a thousand small kernels: on an H200 host
Qwen3-4B spends 32 ms launching them (52 ms after an idle gap) for under 2 ms of weight reads.
Replaying a captured graph launches them all at once. Right-padding a sequence to its bucket must
leave the real tokens' outputs as they were: the function is causal over its sequence (a token
sees only those before it), or it takes a key mask (`key_mask=True`: fn(inputs, valid), valid
[1, L] bool marking the real tokens) and lets no token attend to the padding. It must not read the
device back (capture forbids it). Sequences longer than the largest bucket run eagerly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)
DEFAULT_BUCKET_LENGTHS = (16, 32, 64, 128, 256, 512)
NUM_WARMUP_RUNS = 2  # before capture, on a side stream: lazy inits (cuBLAS handles, workspaces)


class GraphedByLength:
    """fn(inputs [1, L, *row_shape] of `dtype` on `device`) -> [1, L, ...]; captured per bucket by
    `capture()`. Token ids by default (row_shape (), int64); embeddings with row_shape (dim,).

    A call pads `inputs` with `pad_id` to the smallest bucket that holds them, replays that bucket's
    graph, and returns a copy of the first L rows (the graph's output buffer is reused by the next
    replay). With `key_mask`, fn also takes valid [1, L] bool (True on the real tokens). Before
    `capture()`, and on other devices than CUDA, it runs `fn` eagerly: unpadded, or with `key_mask`
    padded to the bucket as a replay is (attention both ways over a padded, masked sequence equals
    the unpadded one in exact arithmetic only: the kernels' shapes differ, and so do the rounded
    results; this way a prompt's states are the same with graphs or without, and those of a run
    padded further, as a pipeline pads to its maximum length). Longer than the largest bucket, it
    runs unpadded. `device` must be the process's current GPU (workers make their group's GPU
    current: worker.use_device)."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        pad_id: int,
        device: torch.device | str,
        bucket_lengths: tuple[int, ...] = DEFAULT_BUCKET_LENGTHS,
        row_shape: tuple[int, ...] = (),
        dtype: torch.dtype = torch.long,
        key_mask: bool = False,
    ):
        self.fn = fn
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.bucket_lengths = tuple(sorted(bucket_lengths))
        self.row_shape = tuple(row_shape)
        self.dtype = dtype
        self.key_mask = key_mask
        # bucket length -> (graph, its input buffer [1, L, ...], its valid buffer [1, L] or None,
        # its output buffer [1, L, ...])
        self._graphs: dict[
            int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None, torch.Tensor]
        ] = {}

    def _run(self, inputs: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        return self.fn(inputs, valid) if self.key_mask else self.fn(inputs)

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def capture(self) -> None:
        """One graph per bucket. No-op off CUDA. A capture that fails (a function that reads the
        device back, say) leaves no graph: calls run eagerly, and a warning says why."""
        if self.device.type != "cuda" or self._graphs:
            return
        try:
            self._capture_all()
        except Exception as exc:
            self._graphs.clear()
            log.warning("CUDA graph capture failed, running eagerly: %s: %s", type(exc).__name__, exc)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Largest bucket first, all in one memory pool: the first sizes it, and the graphs replay
        one at a time."""
        pool = torch.cuda.graph_pool_handle()
        for length in sorted(self.bucket_lengths, reverse=True):
            inputs = torch.full(
                (1, length, *self.row_shape), self.pad_id, dtype=self.dtype, device=self.device
            )
            valid = torch.ones((1, length), dtype=torch.bool, device=self.device) if self.key_mask else None
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(NUM_WARMUP_RUNS):
                    self._run(inputs, valid)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = self._run(inputs, valid)
            self._graphs[length] = (graph, inputs, valid, output)
        log.info("captured %d CUDA graphs (lengths %s)", len(self._graphs), list(self.bucket_lengths))

    def bucket_for(self, length: int) -> int | None:
        return next((bucket for bucket in self.bucket_lengths if bucket >= length), None)

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        """inputs [1, L, ...] on the device -> fn's output [1, L, ...] (a tensor of its own)."""
        length = inputs.shape[1]
        bucket = self.bucket_for(length)
        if bucket is None:
            valid = torch.ones((1, length), dtype=torch.bool, device=inputs.device) if self.key_mask else None
            return self._run(inputs, valid)
        if bucket not in self._graphs:
            return self.run_padded(inputs, bucket) if self.key_mask else self.fn(inputs)
        graph, static_inputs, static_valid, static_output = self._graphs[bucket]
        static_inputs[:, :length].copy_(inputs)
        static_inputs[:, length:].fill_(self.pad_id)
        if static_valid is not None:
            static_valid[:, :length].fill_(True)
            static_valid[:, length:].fill_(False)
        graph.replay()
        return static_output[:, :length].clone()

    def run_padded(self, inputs: torch.Tensor, bucket: int) -> torch.Tensor:
        """fn over `inputs` [1, L, ...] right-padded to `bucket` (>= L), the padding masked, eagerly."""
        length = inputs.shape[1]
        padded = inputs.new_full((1, bucket, *self.row_shape), self.pad_id)
        padded[:, :length] = inputs
        valid = torch.arange(bucket, device=inputs.device)[None] < length  # [1, bucket]
        return self.fn(padded, valid)[:, :length]
