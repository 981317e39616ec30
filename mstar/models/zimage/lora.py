"""Which Linears of the Z-Image DiT take per-request LoRA (every one), on the model as optimize left
it, and the row layouts each step sets for them.

Row layouts, one segment per item of the step unless said:
- "timesteps": the timestep embedder's rows (one per item).
- "items": the modulation rows every block's and the final layer's adaLN take (one per item, then
  the rows pad_rows adds, which apply none).
- "patches": the image patches into the patch embedder (real patches only: the pads are replaced).
- "image": the noise refiner's image tokens (pads included, as diffusers runs them).
- "caption": one caption through the caption embedder and the context refiner, refined once per
  request and label with every row applying that request's adapters (`LoraServing.only`).
- "tokens": the main layers' and the final layer's [image, caption] tokens.
Fused projections (optimize's to_qkv and w13) carry one slice per original module, queries and keys
in the halves order the fusion stored them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from torch import nn

from mstar.diffusion.packing import MIN_COMPILED_ROWS
from mstar.engine.lora.wrap import LoraSlice, LoraTarget
from mstar.models.rotary import halves_order

CAPTION = "caption"


# layouts of a step's packed tokens (thousands of rows): a per-step cost there is paid off
MANY_ROW_LAYOUTS = ("tokens", "image")


def _one(name: str, linear: nn.Linear, layout: str) -> LoraTarget:
    return LoraTarget(name, (LoraSlice(name, linear.out_features),), layout)


def zimage_lora_targets(dit: nn.Module) -> list[LoraTarget]:
    targets = [_one(f"t_embedder.mlp.{i}", dit.t_embedder.mlp[i], "timesteps") for i in (0, 2)]
    targets.append(_one("cap_embedder.1", dit.cap_embedder[1], CAPTION))
    for key, embedder in dit.all_x_embedder.items():
        targets.append(_one(f"all_x_embedder.{key}", embedder, "patches"))
    for stack, layout in (("noise_refiner", "image"), ("context_refiner", CAPTION), ("layers", "tokens")):
        for index, block in enumerate(getattr(dit, stack)):
            targets += _block(f"{stack}.{index}", block, layout)
    for key, final in dit.all_final_layer.items():
        targets.append(_one(f"all_final_layer.{key}.linear", final.linear, "tokens"))
        targets.append(_one(f"all_final_layer.{key}.adaLN_modulation.1", final.adaLN_modulation[1], "items"))
    return [replace(t, many_rows=t.layout in MANY_ROW_LAYOUTS) for t in targets]


def _block(prefix: str, block: nn.Module, layout: str) -> list[LoraTarget]:
    targets = _attention(f"{prefix}.attention", block.attention, layout)
    targets += _feed_forward(f"{prefix}.feed_forward", block.feed_forward, layout)
    if block.modulation:
        targets.append(_one(f"{prefix}.adaLN_modulation.0", block.adaLN_modulation[0], "items"))
    return targets


def _attention(prefix: str, attention: nn.Module, layout: str) -> list[LoraTarget]:
    out = _one(f"{prefix}.to_out.0", attention.to_out[0], layout)
    if not hasattr(attention, "to_qkv"):
        return [_one(f"{prefix}.to_{p}", getattr(attention, f"to_{p}"), layout) for p in "qkv"] + [out]
    dim = attention.to_qkv.out_features // 3
    order = halves_order(attention.n_heads, dim // attention.n_heads)
    slices = (
        LoraSlice(f"{prefix}.to_q", dim, order),
        LoraSlice(f"{prefix}.to_k", dim, order),
        LoraSlice(f"{prefix}.to_v", dim),
    )
    return [LoraTarget(f"{prefix}.to_qkv", slices, layout), out]


def _feed_forward(prefix: str, feed_forward: nn.Module, layout: str) -> list[LoraTarget]:
    out = _one(f"{prefix}.w2", feed_forward.w2, layout)
    if not hasattr(feed_forward, "w13"):
        return [_one(f"{prefix}.w{i}", getattr(feed_forward, f"w{i}"), layout) for i in (1, 3)] + [out]
    hidden = feed_forward.w13.out_features // 2
    slices = (LoraSlice(f"{prefix}.w1", hidden), LoraSlice(f"{prefix}.w3", hidden))
    # the kernel SwiGLU adds w13's expand inside its activation
    path = "activation" if getattr(feed_forward, "fuses_lora_activation", False) else None
    return [LoraTarget(f"{prefix}.w13", slices, layout, path=path), out]


def set_step_rows(lora, geometries: Sequence, request_ids: Sequence[str]) -> None:
    """One packed forward's rows (every layout but the caption's): item i's segments apply
    request_ids[i]'s adapters. geometries: the DiT's ItemGeometry of each item."""
    num_items = len(request_ids)
    num_pad = max(num_items, MIN_COMPILED_ROWS) - num_items
    ids = list(request_ids)
    lora.set_step("timesteps", [1] * num_items, ids)
    lora.set_step("items", [1] * num_items + [num_pad] * bool(num_pad), ids + [None] * bool(num_pad))
    lora.set_step("patches", [g.num_image for g in geometries], ids)
    lora.set_step("image", [g.num_image_padded for g in geometries], ids)
    lora.set_step("tokens", [g.num_tokens for g in geometries], ids)
