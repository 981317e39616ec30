"""Ragged attention over packed segments: backends, plan cache, shared workspace.

A DiT packs the tokens of every (request, label) of a step segment after segment, plans each
attention label once per step and runs it in every layer:

    attn = build_attention("auto", device, torch.bfloat16)
    attn.plan("self", AttentionLayout.self_attention(token_counts))
    attn.plan("cross", AttentionLayout.cross_attention(token_counts, text_counts))
    out = attn.run("self", q, k, v)   # q [Tq, H, D], k/v [Tkv, H, D] -> [Tq, H, D]

PrefixAttention (prefix.py) runs dense attention over a per-segment prefix plus the segment's own
tokens on the same backends and plan cache (a DiT whose text keys/values are computed once).
"""

from mstar.engine.attention.build import backend_candidates, build_attention, check_against_reference
from mstar.engine.attention.layout import AttentionLayout, DeviceLayout
from mstar.engine.attention.platform import Platform
from mstar.engine.attention.prefix import PrefixAttention, PrefixKV, PrefixLayout, StackedPrefixKV
from mstar.engine.attention.ragged import RaggedAttention
from mstar.engine.attention.reference import reference_attention
from mstar.engine.attention.wrapper import PlanWrapper

__all__ = [
    "AttentionLayout",
    "DeviceLayout",
    "PlanWrapper",
    "Platform",
    "PrefixAttention",
    "PrefixKV",
    "PrefixLayout",
    "RaggedAttention",
    "StackedPrefixKV",
    "backend_candidates",
    "build_attention",
    "check_against_reference",
    "reference_attention",
]
