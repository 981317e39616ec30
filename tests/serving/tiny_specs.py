"""Tiny Wan2.2 and Z-Image specs the worker subprocesses resolve by path (random seeded weights)."""

from __future__ import annotations

from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.model import Wan22Spec
from mstar.models.zimage.config import TINY
from mstar.models.zimage.model import ZImageSpec

TINY_WAN_PATH = f"{__name__}:TinyWanSpec"
TINY_ZIMAGE_PATH = f"{__name__}:TinyZImageSpec"


class TinyWanSpec(Wan22Spec):
    def __init__(self):
        super().__init__(tiny_wan22_config())


class TinyZImageSpec(ZImageSpec):
    def __init__(self):
        super().__init__(TINY)
