"""Z-Image's LoRA targets: every Linear of diffusers' model takes an adapter, and the fused model
optimize makes (q/k/v and w1/w3 as one GEMM, queries and keys in halves order; with and without the
kernel modules) applies a pack's per-request adapters as the plain model does (CPU)."""

import copy

import pytest
import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem
from mstar.engine.attention import build_attention
from mstar.engine.lora.wrap import LoraLayers
from mstar.models.zimage.config import TINY
from mstar.models.zimage.lora import zimage_lora_targets
from mstar.models.zimage.optimize import optimize
from mstar.models.zimage.pipeline import ZImagePipeline
from mstar.models.zimage.weights import build_dit
from tests.lora_files import fixed_serving, linear_names, random_adapter

RANK = 4
ADAPTERS = {"x": [(1, 0.7)], "y": [(2, -0.5), (1, 0.3)]}  # "z": none


def test_every_linear_of_diffusers_model_takes_lora():
    diffusers_model = pytest.importorskip("tests.models.zimage.tiny_parts").tiny_transformer()
    dit = build_dit(TINY.dit, "cpu", torch.float32)
    sources = [piece.source for target in zimage_lora_targets(dit) for piece in target.slices]
    assert sorted(sources) == linear_names(diffusers_model)


def _items() -> list[DenoiseItem]:
    generator = torch.Generator().manual_seed(3)

    def item(rid, label, height, width, caption_tokens, condition):
        latents = torch.randn(16, height, width, generator=generator)
        text = torch.randn(caption_tokens, TINY.dit.cap_feat_dim, generator=generator)
        return DenoiseItem(rid, label, latents, 300.0, 0.3, 0, text, condition)

    x = {}  # one request's condition: both its labels keep their refined captions there
    return [
        item("x", COND, 8, 10, 7, x), item("x", UNCOND, 8, 10, 3, x),
        item("y", COND, 12, 6, 20, {}), item("z", COND, 6, 6, 5, {}),
    ]  # fmt: skip


def _predict(dit) -> list[torch.Tensor]:
    layers = LoraLayers(dit, zimage_lora_targets(dit), num_slots=2, max_rank=RANK)
    for slot in (1, 2):
        layers.write(slot, layers.pack(random_adapter(layers, dit, RANK, seed=slot)))
    pipeline = ZImagePipeline(TINY, "cpu", dit=dit, attention=build_attention("torch", "cpu", torch.float32))
    pipeline.lora = fixed_serving(layers, ADAPTERS)
    return pipeline.predict(_items())


@pytest.mark.parametrize("kernels", [False, True], ids=["fused", "kernels"])
def test_fused_model_applies_each_requests_adapters_as_the_plain_one(kernels):
    dit = build_dit(TINY.dit, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    without = ZImagePipeline(TINY, "cpu", dit=copy.deepcopy(dit), attention=attention).predict(_items())
    fused = optimize(copy.deepcopy(dit), fuse=True, kernels=kernels)
    assert hasattr(fused.layers[0].attention, "to_qkv") and hasattr(fused.layers[0].feed_forward, "w13")
    want, got = _predict(dit), _predict(fused)
    for index, (a, b) in enumerate(zip(want, got, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        if index < 3:  # x and y: their adapters matter; z has none
            assert (a - without[index]).abs().max() > 1e-2
        else:
            torch.testing.assert_close(a, without[index], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernels", [False, True], ids=["fused", "kernels"])
def test_the_kernel_swiglu_takes_w13s_expand_in_its_activation(kernels):
    """With the kernel modules every w13 takes the "activation" path (its SwiGLU adds the expand);
    without them the rule's."""
    dit = optimize(build_dit(TINY.dit, "cpu", torch.float32), fuse=True, kernels=kernels)
    layers = LoraLayers(dit, zimage_lora_targets(dit), num_slots=1, max_rank=RANK)
    w13 = [
        (t, layer)
        for t, layer in zip(layers.targets, layers.layers, strict=True)
        if t.module.endswith(".w13")
    ]
    assert {t.path for t, _ in w13} == ({"activation"} if kernels else {None})
    assert ({layer.lora_path for _, layer in w13} == {"activation"}) == kernels
