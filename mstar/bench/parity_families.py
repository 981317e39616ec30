"""What the parity harness's family hooks share, and how a model's hook is found: each family's
bench entry names its hook (`parity`, e.g. mstar.models.wan22.parity:wan_parity), which builds its
ParityFamily (the reference pipeline written with random weights, loaded back, run, and its prompt
embeddings).

Random weights: the DiT and the VAE get random_weights' rule on every tensor (diffusers' own init
leaves layers at zero, which would hide bugs); the text encoders keep transformers' own init.
UMT5's (Mesh TensorFlow's) folds 1/sqrt(d_kv) into the query projection as the trained weights do;
with every matrix at N(0, 1/fan_in) instead, UMT5-XXL's attention logits are 8x too large and the
encoder is chaotic (on the CPU, 6 full-width layers turn a 1e-3 input change into 1e-1), so any
rounding difference between two correct implementations grows to O(1) over its 24 layers.

The tiny variants (`tiny=True`) use the test configs: the same code runs end to end on a CPU.
"""

from __future__ import annotations

from typing import Any

PROMPT = "a tiny red fox runs through fresh snow at dawn, cinematic shot, soft light, detailed fur"
SEED = 77


def device_dtype(device: str):
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def seeded_generator(fields: dict[str, Any]):
    import torch

    return torch.Generator("cpu").manual_seed(int(fields["seed"]))


def cast_like_pretrained(model: Any, dtype: Any) -> Any:
    """To `dtype` but its _keep_in_fp32_modules, as from_pretrained(torch_dtype=...) leaves it."""
    from mstar.bench.baseline import cast_parameters

    return cast_parameters(model, dtype, getattr(model, "_keep_in_fp32_modules", None))


def seeded_image(height: int, width: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def free_device_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def parity_family(model: str, variant: str | None = None, tiny: bool = False):
    """The hook of a registered model's bench entry; `variant` None is the family's first."""
    import importlib
    import inspect

    from mstar.models.registry import MODELS

    registered = MODELS.get(model)
    entry = None
    if registered is not None and registered.bench is not None:
        module_name, name = registered.bench.split(":")
        entry = getattr(importlib.import_module(module_name), name)
    hooks = sorted(n for n, r in MODELS.items() if r.bench and _entry_parity(r.bench))
    if entry is None or entry.parity is None:
        raise ValueError(f"no parity hook for '{model}' (have: {', '.join(hooks)})")
    module_name, name = entry.parity.split(":")
    hook = getattr(importlib.import_module(module_name), name)
    # a hook serving several registered names of its family (Cosmos3's Edge and Nano) takes the name
    if "model" in inspect.signature(hook).parameters:
        return hook(variant, tiny=tiny, model=model)
    return hook(variant, tiny=tiny)


def _entry_parity(bench: str) -> str | None:
    import importlib

    module_name, name = bench.split(":")
    return getattr(importlib.import_module(module_name), name).parity
