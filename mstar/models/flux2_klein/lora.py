"""Which Linears of the FLUX.2 DiT take per-request LoRA, on the model as optimize left it, and the
row layouts each step sets for them.

Row layouts, one segment per item of the step:
- "text": the text stream (the context embedder, each double block's added projections, text
  output and text FFN).
- "image": the image stream, output then reference tokens (the latent embedder, each double block's
  image projections, image output and FFN).
- "joint": the joint [text, image] tokens of the single-stream blocks.
- "output": the output tokens into proj_out.
Fused projections carry one slice per original module, queries and keys in the halves order
optimize stored them in (a single block's fused qkv+MLP projection is one module of the checkpoint,
its query and key rows permuted). The timestep embedder and the global modulations (and the output
norm's) run once per distinct timestep outside the packed step and take no LoRA: an adapter that
updates them is refused when loaded, naming the module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from mstar.engine.lora.wrap import LoraSlice, LoraTarget
from mstar.models.flux2_klein.optimize import FusedParallelSelfAttention
from mstar.models.rotary import halves_order

# layouts of a step's packed tokens (thousands of rows): a per-step cost there is paid off
MANY_ROW_LAYOUTS = ("image", "joint", "output")


def _one(name: str, linear: nn.Linear, layout: str) -> LoraTarget:
    return LoraTarget(name, (LoraSlice(name, linear.out_features),), layout)


def flux2_lora_targets(dit: nn.Module) -> list[LoraTarget]:
    targets = [
        _one("x_embedder", dit.x_embedder, "image"),
        _one("context_embedder", dit.context_embedder, "text"),
    ]
    for index, block in enumerate(dit.transformer_blocks):
        prefix = f"transformer_blocks.{index}"
        targets += _joint_attention(f"{prefix}.attn", block.attn)
        for ff, layout in (("ff", "image"), ("ff_context", "text")):
            for name in ("linear_in", "linear_out"):
                targets.append(_one(f"{prefix}.{ff}.{name}", getattr(getattr(block, ff), name), layout))
    for index, block in enumerate(dit.single_transformer_blocks):
        targets += _parallel_attention(f"single_transformer_blocks.{index}.attn", block.attn)
    targets.append(_one("proj_out", dit.proj_out, "output"))
    return [replace(t, many_rows=t.layout in MANY_ROW_LAYOUTS) for t in targets]


def _joint_attention(prefix: str, attention: nn.Module) -> list[LoraTarget]:
    outs = [
        _one(f"{prefix}.to_out.0", attention.to_out[0], "image"),
        _one(f"{prefix}.to_add_out", attention.to_add_out, "text"),
    ]
    image = ("to_q", "to_k", "to_v")
    text = ("add_q_proj", "add_k_proj", "add_v_proj")
    if not hasattr(attention, "to_qkv"):
        return [
            *(_one(f"{prefix}.{n}", getattr(attention, n), "image") for n in image),
            *(_one(f"{prefix}.{n}", getattr(attention, n), "text") for n in text),
            *outs,
        ]
    dim = attention.to_qkv.out_features // 3
    order = halves_order(dim // attention.head_dim, attention.head_dim)

    def fused(module: str, names: tuple[str, ...], layout: str) -> LoraTarget:
        slices = tuple(
            LoraSlice(f"{prefix}.{name}", dim, order if index < 2 else None)
            for index, name in enumerate(names)
        )
        return LoraTarget(f"{prefix}.{module}", slices, layout)

    return [fused("to_qkv", image, "image"), fused("add_qkv", text, "text"), *outs]


def _parallel_attention(prefix: str, attention: nn.Module) -> list[LoraTarget]:
    projection = attention.to_qkv_mlp_proj
    order = None
    if isinstance(attention, FusedParallelSelfAttention):
        inner = attention.inner_dim
        heads = halves_order(inner // attention.head_dim, attention.head_dim)
        order = torch.cat([heads, inner + heads, torch.arange(2 * inner, projection.out_features)])
    name = f"{prefix}.to_qkv_mlp_proj"
    return [
        LoraTarget(name, (LoraSlice(name, projection.out_features, order),), "joint"),
        _one(f"{prefix}.to_out", attention.to_out, "joint"),
    ]


def set_step_rows(lora, tokens: Sequence, request_ids: Sequence[str]) -> None:
    """One packed forward's rows: item i's segments apply request_ids[i]'s adapters.
    tokens: each item's StepTokens."""
    lora.set_step("text", [t.num_text for t in tokens], request_ids)
    lora.set_step("image", [t.num_image for t in tokens], request_ids)
    lora.set_step("joint", [t.num_tokens for t in tokens], request_ids)
    lora.set_step("output", [t.num_output for t in tokens], request_ids)
