"""LoRA adapters as requests name them and as the server's folder holds them. No torch: the API
process lists the folder and validates requests with this module; the engine loads the tensors
(mstar.engine.lora).

An adapter is a diffusers / PEFT LoRA safetensors file (what diffusers' `load_lora_weights` reads)
in `lora_dir`: `<name>.safetensors`, or a folder `<name>/` holding `pytorch_lora_weights.safetensors`
(what `save_lora_weights` writes) or a single `.safetensors` file. Clients name adapters, never
paths. The folder is listed again on every look-up (cheap: a file's header is read once per
version), so adapters dropped in while the server runs are usable without a restart.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mstar.errors import InvalidParam
from mstar.params import LoraChoice

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_LORA_SCALE = 10.0  # |scale| at most this; diffusers takes any float, past ~2 outputs degrade
ADAPTER_SUFFIX = ".safetensors"
DIFFUSERS_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own cap on the JSON header
METADATA_KEY = "lora_adapter_metadata"  # where diffusers' save_lora_weights keeps the PEFT config

# Key prefixes the formats diffusers reads put before the module name (PEFT, diffusers, original
# checkpoints, kohya / musubi); stripped in this order, repeatedly.
MODULE_PREFIXES = (
    "base_model.model.",
    "transformer.",
    "model.diffusion_model.",
    "diffusion_model.",
    "lora_unet_",
)
TEXT_ENCODER_PREFIXES = ("text_encoder", "lora_te")
# Key endings -> role: "down" (A, [rank, in]), "up" (B, [out, rank]), "alpha" (a scalar).
ROLE_SUFFIXES = (
    (".lora_A.default.weight", "down"),
    (".lora_B.default.weight", "up"),
    (".lora_A.weight", "down"),
    (".lora_B.weight", "up"),
    (".lora_down.weight", "down"),
    (".lora_up.weight", "up"),
    (".lora.down.weight", "down"),
    (".lora.up.weight", "up"),
    (".alpha", "alpha"),
)
IGNORED_SUFFIXES = (".dora_scale",)  # diffusers drops DoRA magnitudes too (with a warning)


class AdapterFileError(ValueError):
    """An adapter file that cannot be used: unreadable, not a LoRA, or keys we do not apply."""


@dataclass(frozen=True)
class LoraKeyRules:
    """What a model family says about adapter files (torch-free; the family's lora_keys module).

    renames: original-checkpoint module names -> diffusers module names, as templates where `{i}`
      stands for a block index ("blocks.{i}.self_attn.q" -> "blocks.{i}.attn1.to_q").
    splits: an original fused module -> the diffusers modules it became (its A is shared, its B
      split in equal row chunks, as diffusers converts a fused qkv LoRA).
    signature: a regex that module names of this family's adapters match (dots or underscores) and
      other families' do not: how /v1/loras tells an adapter's family.
    """

    family: str
    renames: tuple[tuple[str, str], ...] = ()
    splits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    signature: str = ""

    def matches(self, module_names: Sequence[str]) -> bool:
        pattern = re.compile(self.signature)
        return bool(self.signature) and any(pattern.search(name) for name in module_names)


def split_lora_key(key: str) -> tuple[str, str] | None:
    """(module name without format prefixes, role) of one tensor name; None for keys to ignore.
    Raises AdapterFileError for keys of a kind we do not apply (LoRA biases, full-weight diffs,
    LoKr/LoHa, text encoders)."""
    if key.endswith(IGNORED_SUFFIXES):
        return None
    stripped = strip_prefixes(key)
    if stripped.startswith(TEXT_ENCODER_PREFIXES):
        raise AdapterFileError(f"key '{key}' targets a text encoder; only the transformer takes LoRA here")
    for suffix, role in ROLE_SUFFIXES:
        if stripped.endswith(suffix):
            return stripped[: -len(suffix)], role
    raise AdapterFileError(
        f"key '{key}' is not a LoRA down/up weight or alpha (LoRA biases, weight diffs, LoKr and "
        "LoHa are not supported)"
    )


def strip_prefixes(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in MODULE_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def read_header(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(tensor entries {name: {"dtype", "shape", "data_offsets"}}, metadata) of a safetensors file,
    read without torch. Raises AdapterFileError naming what is wrong."""
    try:
        with open(path, "rb") as file:
            head = file.read(8)
            if len(head) != 8:
                raise AdapterFileError("the file is shorter than a safetensors header")
            (length,) = struct.unpack("<Q", head)
            if not 0 < length <= MAX_HEADER_BYTES:
                raise AdapterFileError(f"header length {length} is not a safetensors header")
            raw = file.read(length)
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise AdapterFileError(f"cannot read the file: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise AdapterFileError("the safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise AdapterFileError("the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_bytes = size - 8 - length
    for name, entry in header.items():
        ends = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(ends, list) and len(ends) == 2 and 0 <= ends[0] <= ends[1] <= data_bytes):
            raise AdapterFileError(f"tensor '{name}' lies outside the file (truncated?)")
    return header, metadata if isinstance(metadata, dict) else {}


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter of the folder as its header describes it (error set when it cannot be used)."""

    name: str
    path: str
    size_bytes: int
    mtime_ns: int
    rank: int = 0  # the largest rank over its modules
    num_modules: int = 0
    family: str | None = None
    error: str | None = None

    @property
    def version(self) -> tuple[str, int, int]:
        """Changes when the file is replaced: a store keys loaded weights by it."""
        return (self.path, self.mtime_ns, self.size_bytes)

    def card(self, loaded: bool) -> dict[str, Any]:
        card = {"id": self.name, "object": "lora", "rank": self.rank or None, "family": self.family}
        card |= {"num_modules": self.num_modules, "size_bytes": self.size_bytes, "loaded": loaded}
        return card | ({"error": self.error} if self.error else {})


def describe(name: str, path: str, families: Sequence[LoraKeyRules] = ()) -> AdapterInfo:
    """An AdapterInfo from the file's header (never raises: a bad file gets `error`)."""
    stat = os.stat(path)
    base = AdapterInfo(name, path, stat.st_size, stat.st_mtime_ns)
    try:
        header, _ = read_header(path)
        modules: dict[str, int] = {}
        for key, entry in header.items():
            parts = split_lora_key(key)
            if parts is None or parts[1] == "alpha":
                continue
            shape = entry.get("shape") or [0, 0]
            if len(shape) != 2:
                raise AdapterFileError(f"tensor '{key}' has shape {shape}; LoRA weights are matrices")
            rank = shape[0] if parts[1] == "down" else shape[1]
            modules[parts[0]] = max(modules.get(parts[0], 0), int(rank))
        if not modules:
            raise AdapterFileError("the file holds no LoRA weights")
    except AdapterFileError as exc:
        return AdapterInfo(name, path, stat.st_size, stat.st_mtime_ns, error=str(exc))
    family = next((rules.family for rules in families if rules.matches(list(modules))), None)
    return AdapterInfo(
        base.name, base.path, base.size_bytes, base.mtime_ns, max(modules.values()), len(modules), family
    )


class LoraCatalog:
    """The adapters of `folder`, by name. Thread-safe; headers are cached per file version."""

    def __init__(self, folder: str, families: Sequence[LoraKeyRules] = ()):
        self.folder = os.path.abspath(os.path.expanduser(folder))
        if not os.path.isdir(self.folder):
            raise ValueError(f"lora_dir '{folder}' is not a directory")
        self.families = tuple(families)
        self._cache: dict[str, AdapterInfo] = {}
        self._lock = threading.Lock()

    def scan(self) -> list[AdapterInfo]:
        """Every adapter in the folder now, sorted by name."""
        found = [(name, path) for name, path in self._entries()]
        with self._lock:
            infos = [self._info(name, path) for name, path in found]
            self._cache = {info.name: info for info in infos}
        return sorted(infos, key=lambda info: info.name)

    def get(self, name: str) -> AdapterInfo | None:
        """The adapter called `name` now (None when the folder has none by that name)."""
        if not NAME_PATTERN.match(name):
            return None
        path = self._path_of(name)
        if path is None:
            return None
        with self._lock:
            return self._info(name, path)

    def _info(self, name: str, path: str) -> AdapterInfo:
        try:
            stat = os.stat(path)
        except OSError as exc:
            return AdapterInfo(name, path, 0, 0, error=f"cannot read the file: {exc.strerror or exc}")
        cached = self._cache.get(name)
        if cached is not None and cached.version == (path, stat.st_mtime_ns, stat.st_size):
            return cached
        info = describe(name, path, self.families)
        self._cache[name] = info
        return info

    def _entries(self) -> list[tuple[str, str]]:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return []
        entries = []
        for entry in names:
            name = entry[: -len(ADAPTER_SUFFIX)] if entry.endswith(ADAPTER_SUFFIX) else entry
            if NAME_PATTERN.match(name):
                path = self._path_of(name)
                if path is not None:
                    entries.append((name, path))
        return entries

    def _path_of(self, name: str) -> str | None:
        """`<name>.safetensors`, else the one adapter file of the folder `<name>/`."""
        direct = os.path.join(self.folder, name + ADAPTER_SUFFIX)
        if os.path.isfile(direct):
            return direct
        folder = os.path.join(self.folder, name)
        if not os.path.isdir(folder):
            return None
        preferred = os.path.join(folder, DIFFUSERS_WEIGHT_NAME)
        if os.path.isfile(preferred):
            return preferred
        files = [f for f in sorted(os.listdir(folder)) if f.endswith(ADAPTER_SUFFIX)]
        return os.path.join(folder, files[0]) if len(files) == 1 else None


def check_lora_choices(
    choices: Sequence[LoraChoice],
    catalog: LoraCatalog | None,
    max_per_request: int,
    max_rank: int,
    family: str | None,
    model_name: str,
) -> tuple[LoraChoice, ...]:
    """The request's adapters, each checked against the folder and the server's caps; InvalidParam
    names the field (`lora`, `lora[1].name`, `lora[0].scale`)."""
    if not choices:
        return ()
    if family is None:
        raise InvalidParam("lora", f"model '{model_name}' does not take LoRA adapters")
    if catalog is None:
        raise InvalidParam("lora", "this server has no LoRA adapters (its lora_dir is not set)")
    if len(choices) > max_per_request:
        raise InvalidParam("lora", f"at most {max_per_request} adapters per request, got {len(choices)}")
    seen: set[str] = set()
    for index, choice in enumerate(choices):
        field = f"lora[{index}]"
        _check_scale(f"{field}.scale", choice.scale)
        if choice.name in seen:
            raise InvalidParam(f"{field}.name", f"adapter '{choice.name}' is named twice")
        seen.add(choice.name)
        info = catalog.get(choice.name)
        if info is None:
            raise InvalidParam(f"{field}.name", f"no adapter '{choice.name}' here; GET /v1/loras lists them")
        if info.error is not None:
            raise InvalidParam(f"{field}.name", f"adapter '{choice.name}' cannot be used: {info.error}")
        if info.rank > max_rank:
            raise InvalidParam(
                f"{field}.name",
                f"adapter '{choice.name}' has rank {info.rank}, above this server's max_lora_rank of {max_rank}",
            )
        if info.family is not None and info.family != family:
            raise InvalidParam(
                f"{field}.name", f"adapter '{choice.name}' is for {info.family}; this model is {family}"
            )
    return tuple(choices)


def _check_scale(field: str, scale: Any) -> None:
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise InvalidParam(field, f"must be a finite number, got {scale!r}")
    if abs(scale) > MAX_LORA_SCALE:
        raise InvalidParam(field, f"must be in [-{MAX_LORA_SCALE:g}, {MAX_LORA_SCALE:g}], got {scale}")
