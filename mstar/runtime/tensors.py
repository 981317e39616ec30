"""Request tensors at the shared-memory boundary: torch or numpy in, numpy bytes out, and back.

torch is imported only when a torch tensor is met or when the worker already loaded torch (a
real model's nodes did): then imported tensors come back as CPU torch tensors (nodes move them to
their device). Workers of torch-free models get numpy arrays and never import torch.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from mstar.runtime.messages import TensorRef
from mstar.runtime.shm import BF16, SegmentStore, bf16_words_to_float32

NUMERIC_KINDS = "biufc"


def to_numpy(value: Any) -> tuple[np.ndarray, str]:
    """(host array, carried dtype name). bf16 torch tensors travel as their 16-bit words."""
    if isinstance(value, np.ndarray):
        array = value
    elif type(value).__module__.startswith("torch"):
        import torch

        tensor = value.detach().to("cpu").contiguous()
        if tensor.dtype == torch.bfloat16:
            return tensor.view(torch.int16).numpy().view(np.uint16), BF16
        array = tensor.numpy()
    else:
        raise TypeError(f"request tensors must be torch tensors or numpy arrays, got {type(value).__name__}")
    if array.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(f"request tensors must be numeric, got dtype {array.dtype}")
    return array, array.dtype.name


def export_tensors(store: SegmentStore, rid: str, tensors: dict[str, Any]) -> list[TensorRef]:
    refs: list[TensorRef] = []
    try:
        for key, value in tensors.items():
            array, dtype_name = to_numpy(value)
            refs.append(store.write(rid, key, array, dtype_name))
    except BaseException:
        store.unlink_all(refs)
        raise
    return refs


def import_tensors(store: SegmentStore, refs: list[TensorRef]) -> dict[str, Any]:
    """Inside a worker: torch tensors when torch is loaded, else numpy arrays."""
    as_torch = "torch" in sys.modules or any(ref.dtype == BF16 for ref in refs)
    return _read_all(store, refs, lambda array, ref: _to_torch(array, ref.dtype) if as_torch else array)


def import_outputs(store: SegmentStore, refs: list[TensorRef]) -> dict[str, np.ndarray]:
    """In the API process: numpy only (bf16 widened to float32)."""
    return _read_all(
        store, refs, lambda array, ref: bf16_words_to_float32(array) if ref.dtype == BF16 else array
    )


def _read_all(store: SegmentStore, refs: list[TensorRef], convert) -> dict[str, Any]:
    """Read every segment (each read unlinks its own); if one fails, unlink the unread rest."""
    tensors: dict[str, Any] = {}
    for index, ref in enumerate(refs):
        try:
            array = store.read(ref)
        except BaseException:
            store.unlink_all(refs[index + 1 :])
            raise
        tensors[ref.key] = convert(array, ref)
    return tensors


def _to_torch(array: np.ndarray, dtype_name: str) -> Any:
    import torch

    if not array.flags.writeable:
        array = array.copy()
    if dtype_name == BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
