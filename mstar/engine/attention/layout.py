"""The host-side description of one packed attention step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AttentionLayout:
    """Segment lengths of a packed step, segment after segment; hashable so it can key a plan cache.

    Query segment i attends to key/value segment i only. `causal` is part of the identity: the same
    lengths with a different mask are a different plan.
    """

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    causal: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "q_lens", tuple(int(n) for n in self.q_lens))
        object.__setattr__(self, "kv_lens", tuple(int(n) for n in self.kv_lens))
        if len(self.q_lens) != len(self.kv_lens):
            raise ValueError(
                f"AttentionLayout: {len(self.q_lens)} query segments but {len(self.kv_lens)} key segments"
            )
        if not self.q_lens:
            raise ValueError("AttentionLayout: needs at least one segment")
        if min(self.q_lens) < 1 or min(self.kv_lens) < 1:
            raise ValueError(f"AttentionLayout: segment lengths must be >= 1, got {self}")

    @classmethod
    def self_attention(cls, lens: tuple[int, ...] | list[int], causal: bool = False) -> AttentionLayout:
        """Each segment attends to itself."""
        return cls(q_lens=tuple(lens), kv_lens=tuple(lens), causal=causal)

    @classmethod
    def cross_attention(
        cls, q_lens: tuple[int, ...] | list[int], kv_lens: tuple[int, ...] | list[int]
    ) -> AttentionLayout:
        """Segment i of the image/video tokens attends to segment i of the text tokens."""
        return cls(q_lens=tuple(q_lens), kv_lens=tuple(kv_lens), causal=False)

    @property
    def num_segments(self) -> int:
        return len(self.q_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_kv(self) -> int:
        return sum(self.kv_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_kv_len(self) -> int:
        return max(self.kv_lens)

    def cu_seqlens_q(self) -> list[int]:
        """Offsets [0, n1, n1+n2, ...] of the query segments in the packed tokens."""
        return _cumulative(self.q_lens)

    def cu_seqlens_kv(self) -> list[int]:
        return _cumulative(self.kv_lens)


def _cumulative(lens: tuple[int, ...]) -> list[int]:
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    return offsets


@dataclass(frozen=True, eq=False)
class DeviceLayout:
    """A layout whose offsets already live on the device (built by a kernel, not by the host).

    Planning it always does the work: comparing it with the last plan would read the device and
    sync the stream. The host still supplies the maxima and totals, which kernels need as ints.
    """

    cu_seqlens_q: torch.Tensor  # int32 [num_segments + 1]
    cu_seqlens_kv: torch.Tensor  # int32 [num_segments + 1]
    max_q_len: int
    max_kv_len: int
    total_q: int
    total_kv: int
    causal: bool = False

    @property
    def num_segments(self) -> int:
        return int(self.cu_seqlens_q.shape[0]) - 1

    def host_lens(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Segment lengths read back to the host (syncs a CUDA stream: fallback paths only)."""
        cu_q = self.cu_seqlens_q.tolist()
        cu_kv = self.cu_seqlens_kv.tolist()
        q_lens = tuple(b - a for a, b in zip(cu_q[:-1], cu_q[1:], strict=True))
        kv_lens = tuple(b - a for a, b in zip(cu_kv[:-1], cu_kv[1:], strict=True))
        return q_lens, kv_lens

    def to_host_layout(self) -> AttentionLayout:
        q_lens, kv_lens = self.host_lens()
        return AttentionLayout(q_lens=q_lens, kv_lens=kv_lens, causal=self.causal)


AnyLayout = AttentionLayout | DeviceLayout
