"""What requests keep from their text across their steps (the DiT's text cross-attention keys and
values, a refined caption), within a byte budget a node holds for all of its requests.

    kept = KeptText(max_bytes=16 << 30)
    kept.keep(request_id, value, condition, key, name)  # condition[key][name] = value, if it has room
    kept.free(request_id)                               # at the request's last step, or when it ends

Without a budget, the text work of many long requests in one loop grows without bound (LTX-2 keeps
1.2 GB a text, 2.4 GB a guided request): past the budget a request recomputes its text work at each
step, which gives the same bytes, and keeps it at the first step after room frees.
"""

from __future__ import annotations

from typing import Any

import torch


def value_bytes(value: Any) -> int:
    """Bytes of the tensors in a value (a tensor, or sequences and dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(value_bytes(part) for part in value)
    if isinstance(value, dict):
        return sum(value_bytes(part) for part in value.values())
    return 0


class KeptText:
    """Per request, the values it keeps and their bytes; `max_bytes` over every request (None: no
    bound; 0: nothing is kept)."""

    def __init__(self, max_bytes: int | None):
        self.max_bytes = max_bytes
        self._bytes: dict[str, int] = {}
        self._held: dict[str, list[tuple[dict, str, Any]]] = {}  # request -> (condition, key, name)
        self.num_refused = 0  # values computed but not kept, for want of room

    @property
    def num_bytes(self) -> int:
        return sum(self._bytes.values())

    def keep(self, request_id: str, value: Any, condition: dict, key: str, name: Any) -> bool:
        """condition[key][name] = value, counted against the budget; False (nothing kept) past it."""
        size = value_bytes(value)
        if self.max_bytes is not None and self.num_bytes + size > self.max_bytes:
            self.num_refused += 1
            return False
        condition.setdefault(key, {})[name] = value
        self._bytes[request_id] = self._bytes.get(request_id, 0) + size
        self._held.setdefault(request_id, []).append((condition, key, name))
        return True

    def free(self, request_id: str) -> None:
        """Drop what the request keeps (its condition's keys too, once empty) and give its bytes back."""
        for condition, key, name in self._held.pop(request_id, ()):
            kept = condition.get(key, {})
            kept.pop(name, None)
            if not kept:
                condition.pop(key, None)
        self._bytes.pop(request_id, None)
