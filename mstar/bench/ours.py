"""Our DiTs as the step benchmark drives them: built from a diffusers config, loaded with diffusers'
state dict (keys identical by contract, INTERFACES.md section 4), run on a list of items.

This is the one place that knows our DiT's constructor and forward; everything is imported lazily
so the benchmark still runs (diffusers only, saying so) when the engine or a model is missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any

TRITON_KERNELS_ENV = "MSTAR_TRITON_KERNELS"
FUSE_PROJECTIONS_ENV = "MSTAR_FUSE_PROJECTIONS"
DIT_MODULES = {"wan": "mstar.models.wan22.dit", "zimage": "mstar.models.zimage.dit"}


class OursUnavailable(RuntimeError):
    """Our DiT cannot be built here; the message says why (missing module, backend, ...)."""


def _dit_module(family: str) -> Any:
    module_name = DIT_MODULES[family]
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise OursUnavailable(f"{module_name} is not importable: {error}") from error


def _dit_class(module: Any) -> type:
    """The module's nn.Module whose name ends in DiT (WanDiT, ZImageDiT)."""
    import torch

    for name, obj in vars(module).items():
        if inspect.isclass(obj) and issubclass(obj, torch.nn.Module) and name.endswith("DiT"):
            return obj
    raise OursUnavailable(f"{module.__name__} defines no DiT class (a torch.nn.Module named *DiT)")


def _construct(module: Any, dit_class: type, config: dict[str, Any]) -> Any:
    """Built from the diffusers config dict: `from_config(dict)`, else the module's *DiTConfig.from_dict."""
    if hasattr(dit_class, "from_config"):
        return dit_class.from_config(config)
    for name, obj in vars(module).items():
        if name.endswith("DiTConfig") and hasattr(obj, "from_dict"):
            return dit_class(obj.from_dict(config))
    raise OursUnavailable(f"{dit_class.__name__}: no from_config and no *DiTConfig.from_dict to build it")


def cast_parameters(model: Any, dtype: Any, keep_fp32: tuple[str, ...] | list[str] | None) -> Any:
    """Parameters to `dtype`, except modules named in `keep_fp32` (diffusers' _keep_in_fp32_modules
    rule, as from_pretrained(torch_dtype=...) applies it); buffers (rotary tables) are left as built."""
    import torch

    keep = set(keep_fp32 or ())
    for name, param in model.named_parameters():
        target = torch.float32 if keep.intersection(name.split(".")) else dtype
        if param.is_floating_point() and param.dtype != target:
            param.data = param.data.to(target)
    return model


def to_inputs(module: Any, items: list[dict]) -> list[Any]:
    """The benchmark's item dicts as the DiT's input objects (its DiTInput), when it has one."""
    input_class = getattr(module, "DiTInput", None)
    if input_class is None:
        return items
    if hasattr(input_class, "of"):
        return [input_class.of(item) for item in items]
    names = {f.name for f in dataclasses.fields(input_class)}
    text_field = "text" if "text" in names else "caption"
    return [
        input_class(latents=i["latents"], timestep=float(i["timestep"]), **{text_field: i["text"]})
        for i in items
    ]


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
    """A callable items -> outputs (one per item) running our DiT with the given
    attention backend and compile mode (the engine's own compile path)."""
    import torch

    module = _dit_module(family)
    dit_class = _dit_class(module)
    try:
        from mstar.engine.attention import build_attention

        attn = build_attention(backend=attention_backend, device=device, dtype=dtype)
    except (ImportError, ValueError) as error:
        raise OursUnavailable(f"attention backend '{attention_backend}': {error}") from error
    # Built on the device (not meta: a DiT may compute tables at init), then given diffusers' weights;
    # without diffusers, our own seeded init stands.
    torch.manual_seed(seed)
    with torch.device(device):
        dit = _construct(module, dit_class, config)
    if state_dict is not None:
        dit.load_state_dict(state_dict, strict=True)
    keep_fp32 = getattr(dit, "fp32_param_patterns", None) or getattr(dit, "_keep_in_fp32_modules", None)
    dit = cast_parameters(dit.to(device=device), dtype, keep_fp32).eval().requires_grad_(False)
    if hasattr(dit, "fuse_projections") and fuse_projections_enabled(device):
        dit.fuse_projections()  # after loading diffusers' keys, before compile (as the server does)
        if hasattr(dit, "use_qk_kernel") and triton_kernels_enabled(device):
            dit.use_qk_kernel()
            if hasattr(dit, "use_norm_kernel"):
                dit.use_norm_kernel()
    _apply_compile_mode(dit, compile_mode)

    kept: dict[int, Any] = {}  # per text tensor, what the server keeps per request and label

    def forward(items: list[dict]) -> list[Any]:
        inputs = to_inputs(module, items)
        if KEEP_PER_REQUEST:
            for item, raw in zip(inputs, items, strict=True):
                _keep_text_state(dit, attn, item, raw, kept)
        return _call(dit, attn, inputs)

    return forward


# As served: a request's text-only work (Wan's cross-attention keys/values, Z-Image's refined
# caption) runs at its first step and is reused; the step figure is the cost of every later step.
KEEP_PER_REQUEST = os.environ.get("MSTAR_BENCH_KEEP_TEXT", "1") != "0"


def _keep_text_state(dit: Any, attn: Any, item: Any, raw: dict, kept: dict[int, Any]) -> None:
    key = id(raw["text"])
    if hasattr(dit, "text_kv") and hasattr(item, "text_kv"):
        if key not in kept:
            kept[key] = dit.text_kv(item.text)
        item.text_kv = kept[key]
    elif hasattr(dit, "refine_caption") and hasattr(item, "refined_caption"):
        if key not in kept:
            kept[key] = dit.refine_caption(item.caption, attn)
        item.refined_caption = kept[key]


def _env_switch(name: str) -> bool | None:
    """An on/off environment switch: "1" on, "0" off, unset or empty None (the caller's default)."""
    setting = os.environ.get(name, "")
    if setting not in ("", "0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got '{setting}'")
    return None if setting == "" else setting == "1"


def triton_kernels_enabled(device: str) -> bool:
    """MSTAR_TRITON_KERNELS=1 uses the hand-written kernels where projections are fused (on the CPU:
    the ops' PyTorch definitions), =0 never; unset: ServerConfig's rule (CUDA with Triton)."""
    switch = _env_switch(TRITON_KERNELS_ENV)
    if switch is not None:
        return switch
    from mstar.engine.kernels import triton_kernels_usable

    return triton_kernels_usable(device)


def fuse_projections_enabled(device: str) -> bool:
    """MSTAR_FUSE_PROJECTIONS=1 fuses anywhere, =0 never; unset: on CUDA only (ServerConfig's rule)."""
    switch = _env_switch(FUSE_PROJECTIONS_ENV)
    return str(device).startswith("cuda") if switch is None else switch


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
