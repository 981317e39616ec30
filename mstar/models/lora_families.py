"""The LoRA key layouts of the families that take adapters (torch-free): how /v1/loras tells an
adapter's family, and what each family's spec hands the engine."""

from mstar.models.flux2_klein.lora_keys import FLUX2_LORA_KEYS
from mstar.models.wan22.lora_keys import WAN22_LORA_KEYS
from mstar.models.zimage.lora_keys import ZIMAGE_LORA_KEYS

LORA_KEY_RULES = (WAN22_LORA_KEYS, ZIMAGE_LORA_KEYS, FLUX2_LORA_KEYS)
