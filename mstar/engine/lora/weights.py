"""An adapter file as per-module LoRA weights, named by the model's diffusers module names.

Reads the layouts diffusers' `load_lora_weights` converts for the DiT families: diffusers / PEFT
(`transformer.<module>.lora_A.weight`, the PEFT config in the file's metadata), original
checkpoints (`diffusion_model.<original module>.lora_down.weight` with `.alpha`), kohya / musubi
(`lora_unet_<module with underscores>.lora_down.weight`). The family's LoraKeyRules say how its
original module names map to diffusers' and which fused original modules were split.

Scaling as diffusers applies it: an `.alpha` key gives alpha / rank for its module; else the PEFT
config in the metadata (lora_alpha / r, rank_pattern, alpha_pattern, rsLoRA's alpha / sqrt(r));
else 1. It is folded into B (float32), so the layer computes scale * (x @ A) @ B with the
request's scale only.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Collection
from dataclasses import dataclass

import torch

from mstar.adapters import METADATA_KEY, AdapterFileError, LoraKeyRules, read_header, split_lora_key

logger = logging.getLogger("mstar.engine.lora")


@dataclass
class ModuleLora:
    """One module's update: W + up @ down, float32. down [rank, in], up [out, rank] (scaling in)."""

    down: torch.Tensor
    up: torch.Tensor

    @property
    def rank(self) -> int:
        return self.down.shape[0]


def load_adapter(path: str, rules: LoraKeyRules, modules: Collection[str]) -> dict[str, ModuleLora]:
    """The adapter at `path` as {diffusers module name: ModuleLora}; `modules` are the names the
    model can take LoRA on. Raises AdapterFileError saying what is wrong with the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _, metadata = read_header(path)  # a clear error for a file that is not safetensors
    try:
        tensors = load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise AdapterFileError(f"cannot read the tensors: {exc}") from None
    return convert_adapter(tensors, metadata, rules, modules)


def convert_adapter(
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str],
    rules: LoraKeyRules,
    modules: Collection[str],
) -> dict[str, ModuleLora]:
    resolver = ModuleResolver(rules, modules)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        parts = split_lora_key(key)
        if parts is None:
            logger.warning("adapter key '%s' ignored (DoRA magnitudes are dropped, as diffusers does)", key)
            continue
        module, role = parts
        group = groups.setdefault(module, {})
        if role in group:
            raise AdapterFileError(f"module '{module}' has two {role} tensors (key '{key}')")
        group[role] = tensor
    config = peft_config(metadata)
    converted: dict[str, ModuleLora] = {}
    for module, group in groups.items():
        down, up = _pair(module, group)
        up = up * _scaling(module, group, down.shape[0], config)
        for name, chunk, num_chunks in resolver.resolve(module):
            part = up if num_chunks == 1 else up.chunk(num_chunks, dim=0)[chunk]
            if name in converted:
                raise AdapterFileError(f"two entries of the file update module '{name}'")
            converted[name] = ModuleLora(down, part.contiguous())
    if not converted:
        raise AdapterFileError("the file holds no LoRA weights")
    return converted


def _pair(module: str, group: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    down, up = group.get("down"), group.get("up")
    if down is None or up is None:
        raise AdapterFileError(
            f"module '{module}' lacks its {'down (A)' if down is None else 'up (B)'} weight"
        )
    if down.dim() != 2 or up.dim() != 2 or up.shape[1] != down.shape[0]:
        raise AdapterFileError(
            f"module '{module}': A {tuple(down.shape)} and B {tuple(up.shape)} are not a LoRA pair"
        )
    down, up = down.float(), up.float()
    if not (torch.isfinite(down).all() and torch.isfinite(up).all()):
        raise AdapterFileError(f"module '{module}' has non-finite weights")
    return down, up


def peft_config(metadata: dict[str, str]) -> dict:
    """The PEFT LoraConfig save_lora_weights stored (its keys without the `transformer.` prefix)."""
    raw = metadata.get(METADATA_KEY)
    if not raw:
        return {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError:
        raise AdapterFileError(f"the '{METADATA_KEY}' metadata is not valid JSON") from None
    if not isinstance(config, dict):
        return {}
    return {k.removeprefix("transformer."): v for k, v in config.items() if not k.startswith("text_encoder")}


def _scaling(module: str, group: dict[str, torch.Tensor], rank: int, config: dict) -> float:
    alpha = group.get("alpha")
    if alpha is not None:
        if alpha.numel() != 1:
            raise AdapterFileError(f"module '{module}': alpha must be a scalar")
        return float(alpha.item()) / rank
    if not config or "lora_alpha" not in config:
        return 1.0
    r = _pattern_value(config.get("rank_pattern") or {}, module, config.get("r", rank))
    lora_alpha = _pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"])
    return float(lora_alpha) / (math.sqrt(r) if config.get("use_rslora") else float(r))


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank/alpha patterns: a key matches a module name it ends (at a dot boundary)."""
    for pattern, value in patterns.items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return value
    return default


def _template_regex(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(re.escape("{i}"), r"(\d+)") + "$")


class ModuleResolver:
    """Maps a file's module names to the model's: as they are, or renamed from the original
    checkpoint's names, or with dots written as underscores (kohya), or split from a fused one."""

    def __init__(self, rules: LoraKeyRules, modules: Collection[str]):
        self.modules = set(modules)
        self.renames = [(_template_regex(src), dst) for src, dst in rules.renames]
        self.splits = [(_template_regex(src), dsts) for src, dsts in rules.splits]
        known = set(self.modules) | self._original_names(rules)
        self.by_underscores = {name.replace(".", "_"): name for name in known}

    def _original_names(self, rules: LoraKeyRules) -> set[str]:
        """The original-checkpoint names of the model's modules (so kohya names can be looked up)."""
        names = set()
        for src, dst in [*rules.renames, *[(s, d[0]) for s, d in rules.splits]]:
            pattern = _template_regex(dst)
            for module in self.modules:
                match = pattern.match(module)
                if match:
                    names.add(src.replace("{i}", match.group(1)) if match.groups() else src)
        return names

    def resolve(self, name: str) -> list[tuple[str, int, int]]:
        """[(model module, chunk of B, number of chunks)] that `name`'s update goes to."""
        if name not in self.modules and "." not in name:
            name = self.by_underscores.get(name, name)
        if name in self.modules:
            return [(name, 0, 1)]
        for pattern, dst in self.renames:
            match = pattern.match(name)
            if match:
                return self._known([(self._fill(dst, match), 0, 1)], name)
        for pattern, dsts in self.splits:
            match = pattern.match(name)
            if match:
                return self._known([(self._fill(d, match), i, len(dsts)) for i, d in enumerate(dsts)], name)
        raise AdapterFileError(f"module '{name}' is not one this model applies LoRA to")

    @staticmethod
    def _fill(template: str, match: re.Match) -> str:
        return template.replace("{i}", match.group(1)) if match.groups() else template

    def _known(self, targets: list[tuple[str, int, int]], name: str) -> list[tuple[str, int, int]]:
        for target, _, _ in targets:
            if target not in self.modules:
                raise AdapterFileError(f"module '{name}' ('{target}') is not one this model applies LoRA to")
        return targets
