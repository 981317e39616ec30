"""The segmented LoRA linear on CUDA in bf16 at a DiT's sizes: the grouped GEMM path against the
per-segment reference, compiled with the pack length and segment count dynamic and no recompile
when adapters, slots and segments change."""

import pytest
import torch
from torch import nn

from mstar.engine.compile import CompiledFunction
from mstar.engine.lora.linear import LoraRows, grouped_lora_delta, reference_lora_delta
from mstar.engine.lora.paths import PATHS
from mstar.engine.lora.weights import ModuleLora
from mstar.engine.lora.wrap import LoraLayers, linear_targets

pytestmark = pytest.mark.gpu
DIM, RANK, NUM_SLOTS = 3072, 32, 4


def _layers(path=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 3 * DIM), nn.Linear(3 * DIM, DIM)).cuda().to(torch.bfloat16)
    layers = LoraLayers(model, linear_targets(model), num_slots=NUM_SLOTS, max_rank=RANK, path=path)
    for slot in range(1, NUM_SLOTS + 1):
        adapter = {
            name: ModuleLora(torch.randn(RANK, m.in_features) / 30, torch.randn(m.out_features, RANK) / 30)
            for name, m in model.named_children()
        }
        layers.write(slot, layers.pack(adapter, pin=True))
    return model, layers


def test_grouped_path_matches_reference_in_bf16():
    model, layers = _layers()
    lengths = [4096, 4096, 1500, 2600]
    rows = LoraRows.build(
        lengths, [[(1, 1.0)], [(2, 0.5), (3, 0.8)], [], [(4, -1.0)]], "cuda", torch.bfloat16
    )
    x = torch.randn(sum(lengths), DIM, device="cuda", dtype=torch.bfloat16)
    layer = layers.layers[0]
    grouped = grouped_lora_delta(x, layer.lora_a, layer.lora_b(), rows).float()
    reference = reference_lora_delta(x, layer.lora_a, layer.lora_b(), rows).float()
    error = (grouped - reference).pow(2).mean() / reference.pow(2).mean()
    assert error.item() < 1e-4  # >= 40 dB
    assert grouped[8192:9692].abs().max().item() == 0.0  # the segment without adapters


@pytest.mark.parametrize("path", PATHS)
def test_every_path_matches_the_reference_in_bf16_compiled(path):
    """Each path, compiled, against base + reference delta computed in float32 (>= 40 dB)."""
    model, layers = _layers(path)
    lengths = [4096, 1500, 2600, 3000]
    rows = LoraRows.build(
        lengths, [[(1, 1.0)], [], [(2, 0.5), (3, 0.8)], [(4, -1.0)]], "cuda", torch.bfloat16
    )
    layers.context.set("tokens", rows)
    layer = model[0]
    x = torch.randn(sum(lengths), DIM, device="cuda", dtype=torch.bfloat16)
    compiled = CompiledFunction(layer, "deterministic", f"lora-gpu-{path}", duck_shapes=False)
    with torch.inference_mode():
        got = compiled(x).float()
        a, bs = layer.lora_a.float(), [b.float() for b in layer.lora_b()]
        rows32 = LoraRows.build(
            lengths, [[(1, 1.0)], [], [(2, 0.5), (3, 0.8)], [(4, -1.0)]], "cuda", torch.float32
        )
        expected = x.float() @ layer.weight.float().T + layer.bias.float()
        expected += reference_lora_delta(x.float(), a, bs, rows32)
    error = (got - expected).pow(2).mean() / expected.pow(2).mean()
    assert error.item() < 1e-4  # >= 40 dB


@pytest.mark.parametrize("path", PATHS)
def test_compiled_stack_does_not_recompile_for_new_adapters(path):
    model, layers = _layers(path)
    compiled = CompiledFunction(model, "deterministic", "lora-gpu", duck_shapes=False)

    def step(lengths, choices):
        layers.context.set("tokens", LoraRows.build(lengths, choices, "cuda", torch.bfloat16))
        with torch.inference_mode():
            return compiled(torch.randn(sum(lengths), DIM, device="cuda", dtype=torch.bfloat16))

    step([1024, 2048], [[(1, 1.0)], []])
    step([1024, 2048], [[], []])
    compiled.finish_warmup()
    step([512, 3000, 700], [[(2, 0.5)], [(3, 1.0)], [(4, 0.2)]])
    step([4096, 4096, 4096, 4096], [[(1, 1.0)], [(2, 1.0)], [(3, 1.0)], [(4, 1.0)]])
    torch.cuda.synchronize()
    assert compiled.num_recompiles == 0
