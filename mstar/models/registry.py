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
}


def model_names() -> list[str]:
    return list(MODELS)


def get_model_spec(name: str) -> ModelSpec:
    target = MODELS.get(name)
    if target is None:
        raise UnknownModel(name)
    module_name, class_name = target.split(":")
    return getattr(importlib.import_module(module_name), class_name)()
