"""Building the Z-Image components on a device: from a diffusers folder (transformer/, vae/,
text_encoder/, tokenizer/) or with seeded random weights of the real shapes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from mstar.models.zimage.config import DiTConfig, VAEConfig, ZImageConfig, from_json_dict, read_json


def read_safetensors(folder: Path, keep: Callable[[str], bool] = lambda key: True) -> dict[str, torch.Tensor]:
    """Tensors of a diffusers component folder: one *.safetensors file or a sharded index."""
    from safetensors.torch import load_file

    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = json.loads(indexes[0].read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update({k: v for k, v in load_file(str(folder / name)).items() if keep(k)})
    return state


def load_into(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    """Strict load; the error names the first missing, unexpected or mismatched tensor."""
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(f"{where}: missing tensors {missing[:5]}, unexpected tensors {unexpected[:5]}")
    for key, value in state.items():
        if own[key].shape != value.shape:
            raise ValueError(
                f"{where}: tensor '{key}' has shape {tuple(value.shape)}, expected {tuple(own[key].shape)}"
            )
    module.load_state_dict(state, strict=True, assign=True)


def _build(make: Callable[[], nn.Module], device: str, dtype: torch.dtype, state, where: str, seed: int):
    if state is None:
        torch.manual_seed(seed)
        with torch.device(device):
            module = make()
        _seed_zero_inits(module, seed)
    else:
        with torch.device("meta"):
            module = make()
        load_into(module, state, where)
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _seed_zero_inits(module: nn.Module, seed: int) -> None:
    """Pad tokens start at zero in the model's constructor; random weights give them values too."""
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("pad_token"):
                param.copy_(torch.randn(param.shape, generator=generator).to(param.device) * 0.02)


def load_configs(model_path: str | None, fallback: ZImageConfig) -> ZImageConfig:
    """Component configs from the folder's config.json files (the fallback where absent)."""
    if model_path is None:
        return fallback
    root = Path(model_path)
    dit, vae, text = fallback.dit, fallback.vae, fallback.text_encoder
    if (root / "transformer" / "config.json").exists():
        dit = from_json_dict(DiTConfig, read_json(root / "transformer" / "config.json"))
    if (root / "vae" / "config.json").exists():
        vae = from_json_dict(VAEConfig, read_json(root / "vae" / "config.json"))
    if (root / "text_encoder" / "config.json").exists():
        text = read_json(root / "text_encoder" / "config.json")
    return ZImageConfig(dit=dit, vae=vae, scheduler=fallback.scheduler, text_encoder=text)


def build_dit(
    config: DiTConfig, device: str, dtype: torch.dtype, model_path: str | None = None, seed: int = 0
):
    from mstar.models.zimage.dit import ZImageDiT

    state = None if model_path is None else read_safetensors(Path(model_path) / "transformer")
    return _build(lambda: ZImageDiT(config), device, dtype, state, f"{model_path}/transformer", seed)


def build_vae_decoder(
    config: VAEConfig, device: str, dtype: torch.dtype, model_path: str | None = None, seed: int = 0
):
    from mstar.models.zimage.vae import VAEDecoder

    state = None
    if model_path is not None:  # the encoder half is not built: skip its tensors
        state = read_safetensors(
            Path(model_path) / "vae", keep=lambda k: k.startswith(("decoder.", "post_quant_conv."))
        )
    return _build(lambda: VAEDecoder(config), device, dtype, state, f"{model_path}/vae", seed)
