"""Per-request LoRA on each family's served DiT on CUDA (bf16, real widths, a few layers, seeded
random weights): fused (and, where the family has them, kernel) modules compiled as the server
compiles them apply each request's adapters in a pack of four (one without) as the eager plain
model does (>= 40 dB per item), and a new adapter, slot, scale or pack compiles nothing."""

import copy
import dataclasses

import pytest
import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.engine.lora.wrap import LoraLayers
from tests.lora_files import predict_with, psnr_db, random_adapter

pytestmark = pytest.mark.gpu
RANK, MIN_PSNR_DB, DEVICE, DTYPE = 32, 40.0, "cuda", torch.bfloat16
SERVED = {"persistent_rows": True, "duck_shapes": False}


def _wan():
    from mstar.models.wan22.config import Wan22Config
    from mstar.models.wan22.dit import WanDiT
    from mstar.models.wan22.lora import wan_lora_targets
    from mstar.models.wan22.optimize import optimize
    from mstar.models.wan22.pipeline import WanPipeline

    config = dataclasses.replace(Wan22Config(), dit=dataclasses.replace(Wan22Config().dit, num_layers=2))
    with torch.device(DEVICE):
        dit = WanDiT(config.dit).to(DTYPE)
    text = torch.randn(config.max_text_tokens, config.dit.text_dim, device=DEVICE)

    def items(rid, size, seed):
        shape = WanPipeline(config, DEVICE, DTYPE).geometry.latent_shape(*size)
        generator = torch.Generator(DEVICE).manual_seed(seed)
        latents = torch.randn(shape, device=DEVICE, generator=generator)
        return [DenoiseItem(rid, label, latents, 700.0, 0.7, 0, text, {}) for label in (COND, UNCOND)]

    def pipeline(model, attention):
        return WanPipeline(config, DEVICE, DTYPE, dit=model, attention=attention)

    return dit, optimize, wan_lora_targets, pipeline, items, [(320, 192, 9), (256, 256, 5), (192, 320, 13)]


def _zimage():
    from mstar.models.zimage.config import REAL
    from mstar.models.zimage.lora import zimage_lora_targets
    from mstar.models.zimage.optimize import optimize
    from mstar.models.zimage.pipeline import ZImagePipeline
    from mstar.models.zimage.weights import build_dit

    config = dataclasses.replace(REAL, dit=dataclasses.replace(REAL.dit, n_layers=2, n_refiner_layers=1))
    dit = build_dit(config.dit, DEVICE, DTYPE)

    def items(rid, size, seed):
        generator = torch.Generator(DEVICE).manual_seed(seed)
        latent = ZImagePipeline(config, DEVICE).geometry.latent_size(*size)
        latents = torch.randn(config.dit.in_channels, *latent, device=DEVICE, generator=generator)
        caption = torch.randn(40 + seed, config.dit.cap_feat_dim, device=DEVICE, generator=generator)
        return [DenoiseItem(rid, COND, latents, 500.0, 0.5, 0, caption, {})]

    def pipeline(model, attention):
        return ZImagePipeline(config, DEVICE, dit=model, attention=attention)

    return dit, optimize, zimage_lora_targets, pipeline, items, [(512, 512), (384, 640), (768, 256)]


def _flux2():
    from mstar.models.flux2_klein.config import KLEIN_4B
    from mstar.models.flux2_klein.lora import flux2_lora_targets
    from mstar.models.flux2_klein.optimize import optimize
    from mstar.models.flux2_klein.pipeline import Flux2KleinPipeline
    from mstar.models.flux2_klein.weights import build_dit

    transformer = dataclasses.replace(KLEIN_4B.transformer, num_layers=1, num_single_layers=2)
    config = dataclasses.replace(KLEIN_4B, transformer=transformer)
    dit = build_dit(transformer, DEVICE, DTYPE)

    def items(rid, size, seed):
        generator = torch.Generator(DEVICE).manual_seed(seed)
        grid = Flux2KleinPipeline(config, DEVICE).geometry.latent_grid(*size)
        latents = torch.randn(transformer.in_channels, *grid, device=DEVICE, generator=generator)
        text = torch.randn(config.max_sequence_length, transformer.joint_attention_dim, device=DEVICE)
        return [DenoiseItem(rid, COND, latents, 500.0, 0.5, 0, text, {})]

    def pipeline(model, attention):
        return Flux2KleinPipeline(config, DEVICE, dit=model, attention=attention)

    return dit, optimize, flux2_lora_targets, pipeline, items, [(512, 512), (384, 640), (768, 256)]


def _served(dit, targets, make_pipeline, optimize=None, compiled=False):
    if optimize is not None:
        dit = optimize(dit, fuse=True, kernels=True)
    layers = LoraLayers(dit, targets(dit), num_slots=4, max_rank=RANK)
    for slot in range(1, 5):
        layers.write(slot, layers.pack(random_adapter(layers, dit, RANK, seed=slot, b_std=0.05), pin=True))
    parts = (
        compile_methods(dit, type(dit).compiled_methods, "deterministic", "lora-gpu", **SERVED)
        if compiled
        else None
    )
    return make_pipeline(dit, build_attention("auto", DEVICE, DTYPE)), layers, parts


@pytest.mark.parametrize("family", [_wan, _zimage, _flux2], ids=["wan2.2", "z-image", "flux2-klein"])
def test_served_dit_applies_each_requests_adapters_and_compiles_once(family):
    torch.manual_seed(0)
    dit, optimize, targets, make_pipeline, make_items, sizes = family()
    plain = _served(copy.deepcopy(dit), targets, make_pipeline)
    served = _served(dit, targets, make_pipeline, optimize, compiled=True)
    pipeline, layers, parts = served

    def step(pipeline_layers, adapters, sizes_seeds):
        items = [
            i for index, (size, seed) in enumerate(sizes_seeds) for i in make_items(f"r{index}", size, seed)
        ]
        with torch.inference_mode():
            return [out.float() for out in predict_with(*pipeline_layers, items, adapters)]

    step((pipeline, layers), {"r0": [(1, 0.5)]}, [(sizes[0], 0)])  # the graphs the boot warmup compiles
    step((pipeline, layers), {"r0": [(1, 0.5)]}, [(sizes[0], 0), (sizes[0], 1)])
    parts.finish_warmup()
    pack = [(size, index) for index, size in enumerate(sizes)] + [(sizes[0], 9)]
    adapters = {"r0": [(2, 1.0)], "r1": [(3, -0.8)], "r2": [(4, 1.3)]}  # r3: none
    got = step((pipeline, layers), adapters, pack)
    want = step(plain[:2], adapters, pack)
    torch.cuda.synchronize()
    assert parts.num_recompiles == 0
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert psnr_db(a, b) >= MIN_PSNR_DB, index
