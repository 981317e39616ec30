"""Tensors between processes: plain files in /dev/shm (or the private run directory), mmap'd.

Every segment of one server is named `<prefix><rid>-<n>`, so a request's segments and the whole
server's can be found and removed. Each segment has exactly one consumer; reading it maps the
file and unlinks it at once (the acknowledgement), so the pages are freed when the array that
views them is dropped. numpy arrays only here; torch conversion lives in tensors.py.
"""

from __future__ import annotations

import itertools
import mmap
import os
import time
from pathlib import Path

import numpy as np

from mstar.runtime.messages import TensorRef

BF16 = "bfloat16"  # numpy has no bf16: stored and carried as 16-bit words


def default_segment_dir(fallback: str) -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else fallback


class SegmentStore:
    """Creates, reads and removes the segments of one server in one process."""

    def __init__(self, directory: str, prefix: str):
        self.directory = Path(directory)
        self.prefix = prefix
        self._counter = itertools.count()
        self._process_tag = f"{os.getpid():x}"

    def write(self, rid: str, key: str, array: np.ndarray, dtype_name: str | None = None) -> TensorRef:
        """Copy `array` into a new segment. `dtype_name` overrides the carried dtype (bf16 words)."""
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array)
        dtype = dtype_name or array.dtype.name
        if array.nbytes == 0:
            return TensorRef(key, "", dtype, tuple(array.shape), 0)
        name = f"{self.prefix}{rid}-{self._process_tag}-{next(self._counter)}"
        fd = os.open(self.directory / name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, array.nbytes)
            with mmap.mmap(fd, array.nbytes) as mapped:
                np.frombuffer(mapped, dtype=np.uint8)[:] = array.reshape(-1).view(np.uint8)
        finally:
            os.close(fd)
        return TensorRef(key, name, dtype, tuple(array.shape), array.nbytes)

    def read(self, ref: TensorRef) -> np.ndarray:
        """Map the segment (zero copy) and unlink it. bf16 comes back as uint16 words."""
        storage = np.uint16 if ref.dtype == BF16 else np.dtype(ref.dtype)
        if ref.nbytes == 0:
            return np.empty(ref.shape, dtype=storage)
        path = self.directory / ref.segment
        fd = os.open(path, os.O_RDWR)
        try:
            mapped = mmap.mmap(fd, ref.nbytes)
        finally:
            os.close(fd)
            self.unlink(ref)
        return np.frombuffer(mapped, dtype=storage).reshape(ref.shape)

    def unlink(self, ref: TensorRef) -> None:
        if ref.segment:
            _remove(self.directory / ref.segment)

    def unlink_all(self, refs: list[TensorRef]) -> None:
        for ref in refs:
            self.unlink(ref)

    def sweep(self, keep_rids: set[str] | None = None, min_age_s: float = 0.0) -> int:
        """Remove this server's segments, except those of `keep_rids` or younger than `min_age_s`."""
        removed = 0
        now = time.time()
        for path in self.directory.glob(f"{self.prefix}*"):
            rid = path.name[len(self.prefix) :].split("-", 1)[0]
            if keep_rids is not None and rid in keep_rids:
                continue
            if min_age_s > 0 and now - _mtime(path) < min_age_s:
                continue
            removed += _remove(path)
        return removed

    def list_segments(self) -> list[str]:
        return sorted(p.name for p in self.directory.glob(f"{self.prefix}*"))


def bf16_words_to_float32(words: np.ndarray) -> np.ndarray:
    """bf16 is the top half of a float32: shift the words up (no torch needed in the API)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()


def _remove(path: Path) -> int:
    try:
        path.unlink()
        return 1
    except FileNotFoundError:
        return 0
