"""Model names users type, mapped to their specs. Specs import lazily so the API stays light."""

from __future__ import annotations

import importlib

from mstar.errors import UnknownModel
from mstar.graph import ModelSpec

DEFAULT_MODEL = "tiny-digits"

# name -> "module:ModelSpec subclass"
MODELS: dict[str, str] = {
    "tiny-digits": "mstar.models.tiny_digits.model:TinyDigitsSpec",
    "wan2.2-ti2v-5b": "mstar.models.wan22.model:Wan22Spec",
    "z-image-turbo": "mstar.models.zimage.model:ZImageSpec",
    "tiny-chat": "mstar.models.tiny_chat.model:TinyChatSpec",
    "qwen3": "mstar.models.qwen3.model:Qwen3Spec",
    "qwen3-0.6b": "mstar.models.qwen3.model:Qwen3_0_6BSpec",
    "qwen3-1.7b": "mstar.models.qwen3.model:Qwen3_1_7BSpec",
    "qwen3-4b": "mstar.models.qwen3.model:Qwen3_4BSpec",
    "qwen3-8b": "mstar.models.qwen3.model:Qwen3_8BSpec",
}


def model_names() -> list[str]:
    return list(MODELS)


def get_model_spec(name: str) -> ModelSpec:
    """A registered name, or "package.module:SpecClass" (any importable ModelSpec subclass)."""
    target = MODELS.get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        raise UnknownModel(name, model_names())
    module_name, class_name = target.split(":", 1)
    try:
        spec_class = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        if name in MODELS:
            raise
        raise UnknownModel(name, model_names()) from exc
    if not (isinstance(spec_class, type) and issubclass(spec_class, ModelSpec)):
        raise UnknownModel(name, model_names())
    return spec_class()


def spec_path(spec: ModelSpec) -> str:
    """The "module:Class" that get_model_spec resolves back to this spec's class."""
    spec_class = type(spec)
    return f"{spec_class.__module__}:{spec_class.__qualname__}"
