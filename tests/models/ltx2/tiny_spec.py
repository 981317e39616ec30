"""The tiny LTX-2 spec the worker subprocesses resolve by path (seeded random weights, or a tiny
folder written with save_pretrained)."""

from __future__ import annotations

from mstar.models.ltx2.model import LTX2Spec
from mstar.models.ltx2.presets import TINY

TINY_LTX2_PATH = f"{__name__}:TinyLTX2Spec"


class TinyLTX2Spec(LTX2Spec):
    def __init__(self):
        super().__init__(TINY)
