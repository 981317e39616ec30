"""Real-size Wan2.2-TI2V-5B DiT, seeded random bf16 weights: ours vs diffusers on the GPU (832x480x33)."""

import pytest
import torch

from mstar.models.checkpoint import build_module
from mstar.models.wan22.config import WanDiTConfig
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.optimize import optimize

MAX_RELATIVE_ERROR = 2e-2
WIDTH, HEIGHT, NUM_FRAMES = 832, 480, 33


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm())


@pytest.mark.gpu
def test_real_size_dit_matches_diffusers_in_bf16():
    diffusers = pytest.importorskip("diffusers")
    from mstar.engine.attention import build_attention

    device, dtype = "cuda", torch.bfloat16
    config = WanDiTConfig()
    ours = build_module(lambda: WanDiT(config), device, dtype, seed=0, keep_fp32=WanDiT.fp32_param_patterns)
    with torch.device(device):
        theirs = diffusers.WanTransformer3DModel(**config.to_dict())
    # assign=True keeps our dtypes: bf16 with the fp32 parts diffusers keeps (_keep_in_fp32_modules).
    theirs.load_state_dict(ours.state_dict(), strict=True, assign=True)
    theirs.eval().requires_grad_(False)

    generator = torch.Generator(device).manual_seed(0)
    shape = (config.in_channels, (NUM_FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16)
    latents = torch.randn(shape, generator=generator, device=device)
    texts = [0.1 * torch.randn(512, config.text_dim, generator=generator, device=device) for _ in range(2)]
    items = [DiTInput(latents, 500.0, text.to(dtype)) for text in texts]  # a guidance pair, packed

    attention = build_attention("auto", device, dtype)
    with torch.inference_mode():
        packed = ours(items, attention)
        ours = optimize(
            ours, fuse=True, kernels=False
        )  # theirs keeps the separate tensors (assign=True shared them)
        fused = ours(items, attention)
        for item, out, out_fused in zip(items, packed, fused, strict=True):
            assert _relative_error(out_fused, out) <= MAX_RELATIVE_ERROR
            num_tokens = latents.shape[1] * (latents.shape[2] // 2) * (latents.shape[3] // 2)  # patches 1x2x2
            timestep = torch.full((1, num_tokens), item.timestep, device=device)
            expected = theirs(latents[None].to(dtype), timestep, item.text[None], return_dict=False)[0][0]
            assert out.shape == expected.shape
            error = _relative_error(out, expected)
            assert error <= MAX_RELATIVE_ERROR, f"relative error {error:.4f} ({attention.backend_name})"
