"""Model names users type, mapped to their families' spec and bench entry. Both import lazily, so
the API stays light (no torch) and `mstar bench` finds every family here, by its registering.

Adding a family: a folder models/<family>/ (geometry.py, model.py, pipeline.py, the eager model
files, optimize.py, bench.py; a text family: model.py on mstar.llm.spec, nodes.py, bench.py) and
one line below (docs/architecture.md walks through it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mstar.errors import UnknownModel
from mstar.graph import ModelSpec

DEFAULT_MODEL = "tiny-digits"


@dataclass(frozen=True)
class Registered:
    spec: str  # "module:ModelSpec subclass"
    bench: str | None = None  # "module:BenchEntry subclass" (mstar.models.bench_entry), if benchmarked


QWEN3_BENCH = "mstar.models.qwen3.bench:Qwen3Bench"  # one entry for every registered Qwen3 size
COSMOS3_BENCH = "mstar.models.cosmos3.bench:Cosmos3Bench"
FLUX2_KLEIN = "mstar.models.flux2_klein.model:{}"
FLUX2_KLEIN_BENCH = "mstar.models.flux2_klein.bench:Flux2KleinBench"  # one entry for every klein name
MODELS: dict[str, Registered] = {
    "tiny-digits": Registered("mstar.models.tiny_digits.model:TinyDigitsSpec"),
    "wan2.2-ti2v-5b": Registered("mstar.models.wan22.model:Wan22Spec", "mstar.models.wan22.bench:WanBench"),
    "z-image-turbo": Registered(
        "mstar.models.zimage.model:ZImageSpec", "mstar.models.zimage.bench:ZImageBench"
    ),
    "cosmos3-edge": Registered("mstar.models.cosmos3.model:Cosmos3Spec", COSMOS3_BENCH),
    "cosmos3-nano": Registered("mstar.models.cosmos3.model:Cosmos3NanoSpec", COSMOS3_BENCH),
    "tiny-cosmos3": Registered("mstar.models.cosmos3.model:TinyCosmos3Spec"),
    "ltx-2": Registered("mstar.models.ltx2.model:LTX2Spec", "mstar.models.ltx2.bench:LTX2Bench"),
    "flux2-klein-4b": Registered(FLUX2_KLEIN.format("Flux2KleinSpec"), FLUX2_KLEIN_BENCH),
    "flux2-klein-9b": Registered(FLUX2_KLEIN.format("Flux2Klein9BSpec"), FLUX2_KLEIN_BENCH),
    "flux2-klein-base-4b": Registered(FLUX2_KLEIN.format("Flux2KleinBase4BSpec"), FLUX2_KLEIN_BENCH),
    "flux2-klein-base-9b": Registered(FLUX2_KLEIN.format("Flux2KleinBase9BSpec"), FLUX2_KLEIN_BENCH),
    "tiny-chat": Registered("mstar.models.tiny_chat.model:TinyChatSpec", QWEN3_BENCH),
    "qwen3": Registered("mstar.models.qwen3.model:Qwen3Spec", QWEN3_BENCH),
    "qwen3-0.6b": Registered("mstar.models.qwen3.model:Qwen3_0_6BSpec", QWEN3_BENCH),
    "qwen3-1.7b": Registered("mstar.models.qwen3.model:Qwen3_1_7BSpec", QWEN3_BENCH),
    "qwen3-4b": Registered("mstar.models.qwen3.model:Qwen3_4BSpec", QWEN3_BENCH),
    "qwen3-8b": Registered("mstar.models.qwen3.model:Qwen3_8BSpec", QWEN3_BENCH),
}


def model_names() -> list[str]:
    return list(MODELS)


def _resolve(target: str) -> Any:
    module_name, attribute = target.split(":", 1)
    return getattr(importlib.import_module(module_name), attribute)


def get_model_spec(name: str) -> ModelSpec:
    """A registered name, or "package.module:SpecClass" (any importable ModelSpec subclass)."""
    registered = MODELS.get(name)
    target = registered.spec if registered is not None else (name if ":" in name else None)
    if target is None:
        raise UnknownModel(name, model_names())
    try:
        spec_class = _resolve(target)
    except (ImportError, AttributeError) as exc:
        if name in MODELS:
            raise
        raise UnknownModel(name, model_names()) from exc
    if not (isinstance(spec_class, type) and issubclass(spec_class, ModelSpec)):
        raise UnknownModel(name, model_names())
    return spec_class()


def bench_entries() -> list[Any]:
    """Every registered family's bench entry (mstar.models.bench_entry.BenchEntry), once each, in
    order (several names of one family share its entry)."""
    targets = dict.fromkeys(r.bench for r in MODELS.values() if r.bench is not None)
    return [_resolve(target)() for target in targets]


def bench_entry(name: str) -> Any | None:
    """The bench entry of a registered model name (None when its family registers none)."""
    registered = MODELS.get(name)
    if registered is None:
        raise UnknownModel(name)
    return None if registered.bench is None else _resolve(registered.bench)()


def spec_path(spec: ModelSpec) -> str:
    """The "module:Class" that get_model_spec resolves back to this spec's class."""
    spec_class = type(spec)
    return f"{spec_class.__module__}:{spec_class.__qualname__}"
