"""Ragged attention over packed segments: backends, plan cache, shared workspace.

A DiT packs the tokens of every (request, label) of a step segment after segment, plans each
attention label once per step and runs it in every layer:

    attn = build_attention("auto", device, torch.bfloat16)
    attn.plan("self", AttentionLayout.self_attention(token_counts))
    attn.plan("cross", AttentionLayout.cross_attention(token_counts, text_counts))
    out = attn.run("self", q, k, v)   # q [Tq, H, D], k/v [Tkv, H, D] -> [Tq, H, D]
"""

from mstar.engine.attention.layout import AttentionLayout
from mstar.engine.attention.ragged import RaggedAttention, build_attention
from mstar.engine.attention.reference import reference_attention

__all__ = ["AttentionLayout", "RaggedAttention", "build_attention", "reference_attention"]
