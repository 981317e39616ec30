"""Which Linears of the Wan DiT take per-request LoRA, on the model as optimize left it.

Row layouts: "tokens" (the packed latent tokens: self and cross attention's queries and outputs,
the FFN, the output head; one segment per item of the step) and "text" (one item's text: the text
projection and cross attention's keys and values, computed once per request and label, every row
applying that request's adapters). Fused projections carry one slice per original module, queries
and keys in the halves order the fusion stored them in. The timestep embedder and modulation run
one row at a time outside the packed step and take no LoRA: an adapter that updates them is
refused when loaded, naming the module.
"""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mstar.engine.lora.wrap import LoraSlice, LoraTarget
from mstar.models.rotary import halves_order

# layouts of a step's packed tokens (thousands of rows): a per-step cost there is paid off
MANY_ROW_LAYOUTS = ("tokens",)


def _one(name: str, linear: nn.Linear, layout: str, path: str | None = None) -> LoraTarget:
    return LoraTarget(name, (LoraSlice(name, linear.out_features),), layout, path=path)


def wan_lora_targets(dit: nn.Module) -> list[LoraTarget]:
    text = dit.condition_embedder.text_embedder
    targets = [
        _one(f"condition_embedder.text_embedder.{n}", getattr(text, n), "text")
        for n in ("linear_1", "linear_2")
    ]
    for index, block in enumerate(dit.blocks):
        prefix = f"blocks.{index}"
        targets += _self_attention(f"{prefix}.attn1", block.attn1)
        targets += _cross_attention(f"{prefix}.attn2", block.attn2)
        # the kernel FFN adds this Linear's expand inside its GELU
        path = "activation" if getattr(block.ffn, "fuses_lora_activation", False) else None
        targets.append(_one(f"{prefix}.ffn.net.0.proj", block.ffn.net[0].proj, "tokens", path))
        targets.append(_one(f"{prefix}.ffn.net.2", block.ffn.net[2], "tokens"))
    targets.append(_one("proj_out", dit.proj_out, "tokens"))
    return [replace(t, many_rows=t.layout in MANY_ROW_LAYOUTS) for t in targets]


def _self_attention(prefix: str, attention: nn.Module) -> list[LoraTarget]:
    out = _one(f"{prefix}.to_out.0", attention.to_out[0], "tokens")
    if not hasattr(attention, "to_qkv"):
        return [_one(f"{prefix}.to_{p}", getattr(attention, f"to_{p}"), "tokens") for p in "qkv"] + [out]
    dim = attention.to_qkv.out_features // 3
    order = halves_order(attention.heads, dim // attention.heads)
    slices = (
        LoraSlice(f"{prefix}.to_q", dim, order),
        LoraSlice(f"{prefix}.to_k", dim, order),
        LoraSlice(f"{prefix}.to_v", dim),
    )
    return [LoraTarget(f"{prefix}.to_qkv", slices, "tokens"), out]


def _cross_attention(prefix: str, attention: nn.Module) -> list[LoraTarget]:
    targets = [
        _one(f"{prefix}.to_q", attention.to_q, "tokens"),
        _one(f"{prefix}.to_out.0", attention.to_out[0], "tokens"),
    ]
    if not hasattr(attention, "to_kv"):
        return targets + [_one(f"{prefix}.to_{p}", getattr(attention, f"to_{p}"), "text") for p in "kv"]
    dim = attention.to_kv.out_features // 2
    slices = (LoraSlice(f"{prefix}.to_k", dim), LoraSlice(f"{prefix}.to_v", dim))
    return targets + [LoraTarget(f"{prefix}.to_kv", slices, "text")]
