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


class ServedTinyZImageSpec(TinyZImageSpec):
    """The tiny Z-Image with the served minimum sizes lowered to what its 2x VAE makes quickly."""

    min_side = 16
    min_pixels = 16 * 16


SERVED_TINY_ZIMAGE_PATH = f"{__name__}:ServedTinyZImageSpec"
