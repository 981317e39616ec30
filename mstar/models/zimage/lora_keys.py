"""Z-Image's LoRA key layouts (torch-free). Its original module tree is diffusers' already; kohya
names are the same with underscores, and some trainers call the output projection `out` or keep a
fused `qkv` (split into to_q/to_k/to_v, as `_convert_non_diffusers_z_image_lora_to_diffusers` does)."""

from mstar.adapters import LoraKeyRules

_STACKS = ("layers", "noise_refiner", "context_refiner")

ZIMAGE_LORA_KEYS = LoraKeyRules(
    family="z-image",
    renames=tuple((f"{s}.{{i}}.attention.out", f"{s}.{{i}}.attention.to_out.0") for s in _STACKS),
    splits=tuple(
        (f"{s}.{{i}}.attention.qkv", tuple(f"{s}.{{i}}.attention.to_{p}" for p in "qkv")) for s in _STACKS
    ),
    signature=r"^(noise[._]refiner|context[._]refiner|layers[._]\d+[._](attention|feed[._]forward|adaLN))",
)
