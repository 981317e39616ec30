"""Our DiTs as the step benchmark drives them: built from a diffusers config, loaded with diffusers'
state dict (keys identical by contract, INTERFACES.md section 4), run on a list of items.

This is the one place that knows our DiT's constructor and forward; everything is imported lazily
so the benchmark still runs (diffusers only, saying so) when the engine or a model is missing.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

DIT_MODULES = {"wan": "mstar.models.wan22.dit", "zimage": "mstar.models.zimage.dit"}


class OursUnavailable(RuntimeError):
    """Our DiT cannot be built here; the message says why (missing module, backend, ...)."""


def _dit_class(family: str) -> type:
    module_name = DIT_MODULES[family]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise OursUnavailable(f"{module_name} is not importable: {error}") from error
    import torch

    # The DiT is the module's nn.Module whose name ends in DiT or Transformer (e.g. WanDiT).
    candidates = [
        obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, torch.nn.Module)
        and obj.__module__ == module_name
        and name.lower().endswith(("dit", "transformer"))
    ]
    if not candidates:
        raise OursUnavailable(f"{module_name} defines no DiT class (a torch.nn.Module named *DiT)")
    return candidates[0]


def _construct(dit_class: type, config: dict[str, Any]) -> Any:
    """Built from the diffusers config: `from_config(dict)` when offered, else keyword arguments."""
    if hasattr(dit_class, "from_config"):
        return dit_class.from_config(config)
    accepted = inspect.signature(dit_class).parameters
    if "config" in accepted:
        return dit_class(config=config)
    return dit_class(**{k: v for k, v in config.items() if k in accepted})


def build_ours(
    family: str,
    config: dict[str, Any],
    state_dict: dict[str, Any] | None,
    device: str,
    dtype: Any,
    attention_backend: str,
    compile_mode: str,
    seed: int = 0,
) -> Callable[[list[dict]], list[Any]]:
    """A callable items -> outputs (one [C, F, h, w] per item) running our DiT with the given
    attention backend and compile mode (the engine's own compile path)."""
    import torch

    dit_class = _dit_class(family)
    try:
        from mstar.engine.attention import build_attention

        attn = build_attention(backend=attention_backend, device=device, dtype=dtype)
    except (ImportError, ValueError) as error:
        raise OursUnavailable(f"attention backend '{attention_backend}': {error}") from error
    if state_dict is None:  # no diffusers here: our own seeded init, built on the device
        torch.manual_seed(seed)
        with torch.device(device):
            dit = _construct(dit_class, config)
    else:
        with torch.device("meta"):
            dit = _construct(dit_class, config)
        dit.load_state_dict(state_dict, strict=True, assign=True)
    dit = dit.to(device=device, dtype=dtype).eval().requires_grad_(False)
    _apply_compile_mode(dit, compile_mode)

    def forward(items: list[dict]) -> list[Any]:
        return _call(dit, attn, items)

    return forward


def _apply_compile_mode(dit: Any, compile_mode: str) -> None:
    if compile_mode == "off":
        return
    if hasattr(dit, "compile_layers"):
        dit.compile_layers(compile_mode)
        return
    try:
        from mstar.engine.compile import compile_module
    except ImportError as error:
        raise OursUnavailable(f"compile mode '{compile_mode}': no engine compile path ({error})") from error
    compile_module(dit, compile_mode)


def _call(dit: Any, attn: Any, items: list[dict]) -> list[Any]:
    """Our forward takes the LIST of items (contract); the attention resource is passed when the
    signature asks for it."""
    parameters = inspect.signature(dit.forward).parameters
    if "attn" in parameters:
        return list(dit(items, attn=attn))
    if "attention" in parameters:
        return list(dit(items, attention=attn))
    return list(dit(items))
