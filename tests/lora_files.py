"""Adapter files for the LoRA tests, made the way users make them: a tiny diffusers model, PEFT's
add_adapter with random A and B, and the pipeline mixin's save_lora_weights (with its metadata)."""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file


def linear_names(model: torch.nn.Module) -> list[str]:
    return sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))


def save_peft_adapter(model, mixin, folder, name: str, modules: list[str], seed: int, **config) -> str:
    """Add a PEFT adapter `name` on `modules` of `model` (random A and B), save it as diffusers does
    into lora_dir/<name>/pytorch_lora_weights.safetensors, and remove it from the model again."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(seed)
    options = {"r": 4, "lora_alpha": 6} | config
    model.add_adapter(
        LoraConfig(target_modules=modules, init_lora_weights=False, **options), adapter_name=name
    )
    with torch.no_grad():  # PEFT's random init leaves B small; make the update visible
        for module in model.modules():
            if hasattr(module, "lora_B") and name in module.lora_B:
                module.lora_B[name].weight.normal_(0, 0.2)
    state = get_peft_model_state_dict(model, adapter_name=name)
    metadata = model.peft_config[name].to_dict()
    path = os.path.join(folder, name)
    mixin.save_lora_weights(path, transformer_lora_layers=state, transformer_lora_adapter_metadata=metadata)
    model.delete_adapters(name)
    return os.path.join(path, "pytorch_lora_weights.safetensors")


def diffusers_loaded(mixin, model, adapters: dict[str, str], scales: dict[str, float]):
    """`model` with the files loaded as the pipeline's load_lora_weights does, set_adapters at scales."""

    class Pipeline(mixin):
        hf_device_map = None
        components: dict = {}

        def __init__(self, transformer):
            self.transformer = transformer

    pipeline = Pipeline(model)
    for name, path in adapters.items():
        pipeline.load_lora_weights(path, adapter_name=name)
    model.set_adapters(list(scales), list(scales.values()))
    return model


def peft_deltas(model, name: str) -> dict[str, torch.Tensor]:
    """Each LoRA layer's merged update for adapter `name` (PEFT's own get_delta_weight)."""
    return {
        module_name: module.get_delta_weight(name)
        for module_name, module in model.named_modules()
        if hasattr(module, "get_delta_weight") and name in getattr(module, "lora_A", {})
    }


def write_adapter(path: str, tensors: dict[str, torch.Tensor], metadata: dict | None = None) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)
    return path


def psnr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    error = (ours.double() - reference.double()).pow(2).mean().item()
    peak = reference.double().abs().max().item()
    return float("inf") if error == 0 else 10 * torch.log10(torch.tensor(peak**2 / error)).item()
