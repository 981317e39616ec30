"""Adapter files for the LoRA tests, made the way users make them: a tiny diffusers model, PEFT's
add_adapter with random A and B, and the pipeline mixin's save_lora_weights (with its metadata)."""

from __future__ import annotations

import os
import time

import torch
from safetensors.torch import save_file


def linear_names(model: torch.nn.Module) -> list[str]:
    return sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))


def save_peft_adapter(
    model, mixin, folder, name: str, modules: list[str], seed: int, b_std: float = 0.2, **config
) -> str:
    """Add a PEFT adapter `name` on `modules` of `model` (random A and B), save it as diffusers does
    into lora_dir/<name>/pytorch_lora_weights.safetensors, and remove it from the model again.
    b_std: the spread of B (PEFT's random init leaves it small)."""
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
                module.lora_B[name].weight.normal_(0, b_std)
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


class WaitingForAdapters:
    """A DiT node as the step loop drives it: requests are prepared when they arrive (their adapters
    start loading) and a batch rides only once their adapters are ready (the node's readiness
    hook), polled with a hang guard."""

    def __init__(self, node, timeout_s: float = 60.0):
        self.node = node
        self.timeout_s = timeout_s

    def __getattr__(self, name):
        return getattr(self.node, name)

    def forward(self, batch):
        for request in batch:  # the step loop prepares a request when it enters the node
            if self.node.name not in request.state:
                self.node.prepare(request)
        deadline = time.monotonic() + self.timeout_s
        while not all(self.node.ready(request) for request in batch):
            assert time.monotonic() < deadline, "adapters never became ready"
            time.sleep(0.01)
        self.node.forward(batch)


def random_adapter(layers, model, rank: int, seed: int, b_std: float = 0.1) -> dict:
    """A random adapter (mstar.engine.lora.weights.ModuleLora per diffusers module) on every module
    `layers` wraps in `model`."""
    from mstar.engine.lora.weights import ModuleLora

    generator = torch.Generator().manual_seed(seed)
    adapter = {}
    for target in layers.targets:
        in_features = model.get_submodule(target.module).in_features
        for piece in target.slices:
            down = torch.randn(rank, in_features, generator=generator) / in_features**0.5
            up = b_std * torch.randn(piece.out_features, rank, generator=generator)
            adapter[piece.source] = ModuleLora(down, up)
    return adapter


def fixed_serving(layers, adapters: dict, device: str = "cpu"):
    """The LoraServing a pipeline's predict drives, over adapters already written into their slots
    (request id -> [(slot, scale)]) in place of the device LRU."""
    from types import SimpleNamespace

    from mstar.engine.lora.serving import LoraServing

    store = SimpleNamespace(device=torch.device(device), adapters=lambda rid: adapters.get(rid, []))
    return LoraServing(layers, store)


def compiles_of(parts) -> list[int]:
    """Compiles so far of each compiled part (mstar.engine.compile.CompiledParts)."""
    return [part.num_compiles for part in parts.parts]


def predict_with(pipeline, layers, items, adapters: dict):
    """One packed step through the pipeline's predict, request i applying adapters[rid] (slot, scale)."""
    pipeline.lora = fixed_serving(layers, adapters, str(pipeline.device))
    return pipeline.predict(items)
