"""On CUDA with inductor (what the CPU tests of each DiT cannot see: inductor's own guards), each
DiT's compiled stacks compile once for every item count. Tiny configs, bf16, deterministic mode."""

import dataclasses

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods

SERVED_OPTIONS = {"persistent_rows": True, "duck_shapes": False}  # as build_dit_node compiles them


def _cuda_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.mark.gpu
def test_wan_stack_compiles_once_on_cuda():
    _cuda_or_skip()
    from mstar.models.wan22.config import tiny_wan22_config
    from mstar.models.wan22.dit import DiTInput, WanDiT

    torch.manual_seed(0)
    # head_dim 16: CUDA's varlen attention takes head sizes in multiples of 8 (the tiny config has 12)
    config = dataclasses.replace(tiny_wan22_config().dit, attention_head_dim=16)
    dit = WanDiT(config).to("cuda", torch.bfloat16).eval()
    parts = compile_methods(dit, WanDiT.compiled_methods, "deterministic", "wan.dit", **SERVED_OPTIONS)
    attention = build_attention("torch", "cuda", torch.bfloat16)

    def item(frames, height, width, timestep=999.0, num_clean_frames=0):
        latents = torch.randn(16, frames, height, width, device="cuda")
        return DiTInput(latents, timestep, torch.randn(16, 16, device="cuda"), num_clean_frames)

    batches = [
        [item(2, 8, 12)],
        [item(2, 8, 12)] * 2,
        [item(2, 12, 8), item(3, 8, 8, 5.0), item(2, 8, 12)] * 2,
    ]
    batches.append([item(3, 8, 8, num_clean_frames=1)])
    with torch.inference_mode():
        for batch in batches:
            dit(batch, attention)
    assert [part.num_compiles for part in parts.parts] == [1]


@pytest.mark.gpu
def test_zimage_stacks_compile_once_on_cuda():
    _cuda_or_skip()
    from mstar.models.zimage.config import TINY
    from mstar.models.zimage.dit import DiTInput
    from mstar.models.zimage.weights import build_dit

    dit = build_dit(TINY.dit, "cuda", torch.bfloat16)
    parts = compile_methods(dit, type(dit).compiled_methods, "deterministic", "zimage.dit", **SERVED_OPTIONS)
    attention = build_attention("torch", "cuda", torch.bfloat16)

    def item(height, width, num_caption):
        caption = torch.randn(num_caption, TINY.dit.cap_feat_dim, device="cuda")
        return DiTInput(torch.randn(16, height, width, device="cuda"), 0.3, caption)

    with torch.inference_mode():
        for batch in (
            [item(12, 10, 7)],
            [item(12, 10, 7)] * 2,
            [item(8, 8, 20), item(10, 12, 3), item(12, 10, 7)],
        ):
            dit(batch, attention)
    assert [part.num_compiles for part in parts.parts] == [1, 1]
