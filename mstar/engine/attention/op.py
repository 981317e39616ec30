"""The custom op `mstar::ragged_attention`: how run() stays one opaque node in a compiled layer stack.

torch.compile cannot trace into kernels that read host-planned state, so run() calls this op with
tensors and two ints (which RaggedAttention, which label). The op looks the active plan up at call
time, so one compiled graph serves every step's layout; the fake impl gives the output shape from
the inputs alone, so the packed length can stay dynamic.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mstar.engine.attention.ragged import RaggedAttention

_instances: weakref.WeakValueDictionary[int, RaggedAttention] = weakref.WeakValueDictionary()
_next_id = itertools.count(1)


def register_instance(attention: RaggedAttention) -> int:
    """A small id the op can carry as an int argument."""
    instance_id = next(_next_id)
    _instances[instance_id] = attention
    return instance_id


@torch.library.custom_op("mstar::ragged_attention", mutates_args=())
def ragged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, instance_id: int, label_id: int
) -> torch.Tensor:
    attention = _instances.get(instance_id)
    if attention is None:
        raise RuntimeError(f"mstar::ragged_attention: attention instance {instance_id} no longer exists")
    return attention.run_active(label_id, q, k, v)


@ragged_attention.register_fake
def _ragged_attention_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, instance_id: int, label_id: int
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))  # [Tq, H, Dv]
