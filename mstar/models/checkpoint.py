"""Diffusers-layout checkpoints: read a component straight onto its device and dtype, or seed it.

    folder = component_path(model_path, "transformer")          # error if model_index/folder missing
    config = read_config(folder)                                  # its config.json
    dit = build_module(lambda: WanDiT(cfg), device="cuda:0", dtype=torch.bfloat16,
                       folder=folder, keep_fp32=WanDiT.fp32_param_patterns, progress=ctx.progress)
    dit = build_module(lambda: WanDiT(cfg), "cuda:0", torch.bfloat16, seed=0)   # --random-weights

The module is built on the meta device, so no full-precision host copy ever exists: each tensor is
read with safetensors' `safe_open` onto the device, cast, and assigned. Single files and sharded
folders (`*.safetensors.index.json`) both work. A missing, unexpected or mis-shaped tensor is an
error naming it. Random weights are drawn per tensor from a generator seeded with (seed, index).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

MODEL_INDEX = "model_index.json"


class CheckpointError(ValueError):
    """The checkpoint on disk does not match the model (names the file or tensor)."""


def read_model_index(model_path: str | Path) -> dict[str, Any]:
    path = Path(model_path) / MODEL_INDEX
    if not path.is_file():
        raise CheckpointError(f"{model_path} is not a diffusers model folder: no {MODEL_INDEX}")
    return json.loads(path.read_text(encoding="utf-8"))


def component_path(model_path: str | Path, component: str) -> Path:
    """The folder of `component` (transformer, vae, text_encoder, tokenizer, scheduler)."""
    read_model_index(model_path)
    folder = Path(model_path) / component
    if not folder.is_dir():
        raise CheckpointError(f"{model_path} has no '{component}' folder")
    return folder


def read_config(folder: str | Path, name: str = "config.json") -> dict[str, Any]:
    path = Path(folder) / name
    if not path.is_file():
        raise CheckpointError(f"missing {path}")
    return json.loads(path.read_text(encoding="utf-8"))


def safetensors_files(folder: str | Path) -> list[Path]:
    """Shards named by a *.safetensors.index.json, else every *.safetensors file in the folder."""
    folder = Path(folder)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = json.loads(indexes[0].read_text(encoding="utf-8"))["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{indexes[0]} names missing shard '{absent[0]}'")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no .safetensors weights in {folder}")
    return files


class _Progress:
    """Reports through BuildContext.progress(label, done, total) when given, else a tqdm bar."""

    def __init__(self, label: str, total: int, callback: Callable[[str, int, int], None] | None):
        self.label, self.total, self.callback, self.done = label, total, callback, 0
        self.bar = None
        if callback is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="tensor", leave=False, disable=None)

    def advance(self) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.label, self.done, self.total)
        elif self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _target_dtype(name: str, dtype: torch.dtype, keep_fp32: Iterable[str]) -> torch.dtype:
    return torch.float32 if any(pattern in name for pattern in keep_fp32) else dtype


def load_weights(
    module: nn.Module,
    folder: str | Path,
    device: str | torch.device,
    dtype: torch.dtype,
    keep_fp32: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
    ignore_unexpected: Iterable[str] = (),
) -> None:
    """Assign every tensor of `module` (built on meta) from the folder's safetensors, on device/dtype."""
    from safetensors import safe_open

    expected = {name: tuple(t.shape) for name, t in module.state_dict().items()}
    ignore_unexpected, keep_fp32 = tuple(ignore_unexpected), tuple(keep_fp32)
    loaded: dict[str, torch.Tensor] = {}
    bar = _Progress(f"loading {Path(folder).name}", len(expected), progress)
    try:
        for path in safetensors_files(folder):
            with safe_open(str(path), framework="pt", device=str(device)) as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    if name not in expected:
                        if any(pattern in name for pattern in ignore_unexpected):
                            continue
                        raise CheckpointError(f"{path.name}: unexpected tensor '{name}'")
                    tensor = handle.get_tensor(name)
                    if tuple(tensor.shape) != expected[name]:
                        raise CheckpointError(
                            f"{path.name}: tensor '{name}' has shape {tuple(tensor.shape)}, "
                            f"the model expects {expected[name]}"
                        )
                    loaded[name] = tensor.to(_target_dtype(name, dtype, keep_fp32))
                    bar.advance()
    finally:
        bar.close()
    for target, source in _tied_keys(module).items():
        if target not in loaded and source in loaded:
            loaded[target] = loaded[source]  # tied weights (e.g. T5 embed_tokens = shared) share storage
    missing = sorted(set(expected) - set(loaded))
    if missing:
        raise CheckpointError(f"{folder}: missing tensor '{missing[0]}' ({len(missing)} missing in all)")
    module.load_state_dict(loaded, strict=True, assign=True)


def _tied_keys(module: nn.Module) -> dict[str, str]:
    """transformers models name their tied tensors {target: source}; plain modules have none."""
    tied = getattr(module, "all_tied_weights_keys", None) or getattr(module, "_tied_weights_keys", None)
    return dict(tied) if isinstance(tied, dict) else {}


def random_weights(
    module: nn.Module,
    device: str | torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    keep_fp32: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> None:
    """Seeded values of sane scale for every tensor of `module` (built on meta), on device/dtype.

    Matrices ~ N(0, 1/fan_in); 1-D "norm" weights are 1; other 1-D tensors (biases) ~ N(0, 0.02).
    The same seed on the same device type gives the same weights.
    """
    state = module.state_dict()
    keep_fp32 = tuple(keep_fp32)
    values: dict[str, torch.Tensor] = {}
    bar = _Progress("random weights", len(state), progress)
    device = torch.device(device)
    generator = torch.Generator(device=device)
    tied = _tied_keys(module)
    for index, (name, like) in enumerate(state.items()):
        if tied.get(name) in values:
            values[name] = values[tied[name]]
            bar.advance()
            continue
        tensor = torch.empty(like.shape, dtype=_target_dtype(name, dtype, keep_fp32), device=device)
        generator.manual_seed(seed * 1_000_003 + index)
        _fill(name, tensor, generator)
        values[name] = tensor
        bar.advance()
    bar.close()
    module.load_state_dict(values, strict=True, assign=True)


@torch.no_grad()
def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """random_weights' rule, in place, on a module already built (e.g. a diffusers model, whose own
    init leaves some layers zero): every floating tensor of its state dict, tied ones once."""
    seen: set[int] = set()
    for index, (name, tensor) in enumerate(module.state_dict(keep_vars=True).items()):
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        generator = torch.Generator(device=tensor.device).manual_seed(seed * 1_000_003 + index)
        _fill(name, tensor.data, generator)
    return module


@torch.no_grad()
def _fill(name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
    if not tensor.is_floating_point():
        tensor.zero_()
    elif tensor.dim() >= 2:
        fan_in = tensor[0].numel()
        tensor.normal_(0.0, fan_in**-0.5, generator=generator)
    elif "norm" in name and name.endswith("weight"):
        tensor.fill_(1.0)
    else:
        tensor.normal_(0.0, 0.02, generator=generator)


def build_module(
    make: Callable[[], nn.Module],
    device: str | torch.device,
    dtype: torch.dtype,
    folder: str | Path | None = None,
    seed: int = 0,
    keep_fp32: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
    ignore_unexpected: Iterable[str] = (),
) -> nn.Module:
    """Build on meta, then load from `folder` (or seed random weights when folder is None); eval mode."""
    with torch.device("meta"):
        module = make()
    if folder is not None:
        load_weights(module, folder, device, dtype, keep_fp32, progress, ignore_unexpected)
    else:
        random_weights(module, device, dtype, seed, keep_fp32, progress)
    leftover = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if leftover:
        raise CheckpointError(f"tensor '{leftover[0]}' was not materialised (a non-persistent buffer?)")
    return module.eval().requires_grad_(False)


def default_dtype(device: str | torch.device, requested: str = "auto") -> torch.dtype:
    """bf16 on GPU, fp32 on CPU for "auto"; else the named dtype."""
    if requested != "auto":
        return getattr(torch, requested)
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
