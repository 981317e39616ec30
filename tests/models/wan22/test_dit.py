"""Our packed Wan DiT against diffusers' WanTransformer3DModel (tiny config, fp32, CPU)."""

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.optimize import optimize

diffusers = pytest.importorskip("diffusers")

MAX_RELATIVE_ERROR = 1e-5


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).norm() / theirs.norm())


@pytest.fixture(scope="module", params=[False, True], ids=["unfused", "fused"])
def models(request):
    config = tiny_wan22_config().dit
    torch.manual_seed(0)
    theirs = diffusers.WanTransformer3DModel(**config.to_dict()).eval()
    ours = WanDiT(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # diffusers' keys: load before fusing
    if request.param:
        ours = optimize(ours, fuse=True, kernels=False)
    return ours, theirs


def _theirs(model, latents, timestep, text, num_clean_frames=0):
    """diffusers with per-token timesteps, as WanPipeline with expand_timesteps does."""
    _, frames, height, width = latents.shape
    mask = torch.ones(frames, height // 2, width // 2)
    mask[:num_clean_frames] = 0
    per_token = (mask * timestep).flatten().unsqueeze(0)
    with torch.no_grad():
        return model(latents[None], per_token, text[None], return_dict=False)[0][0]


def _item(seed, frames, height, width, timestep, text_len=16, num_clean_frames=0):
    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn(16, frames, height, width, generator=generator)
    text = torch.randn(text_len, 16, generator=generator)
    return DiTInput(latents, timestep, text, num_clean_frames)


def _run_ours(model, items):
    with torch.no_grad():
        return model(items, build_attention("torch", "cpu", torch.float32))


def test_single_item_matches_diffusers(models):
    ours, theirs = models
    item = _item(1, 3, 8, 12, 937.0)
    (out,) = _run_ours(ours, [item])
    assert out.shape == item.latents.shape
    assert _relative_error(out, _theirs(theirs, item.latents, item.timestep, item.text)) <= MAX_RELATIVE_ERROR


def test_guidance_pair_and_mixed_sizes_packed_match_alone(models):
    ours, theirs = models
    cond = _item(2, 2, 8, 8, 500.0)
    uncond = DiTInput(cond.latents, cond.timestep, _item(3, 1, 2, 2, 0.0).text)
    other = _item(4, 3, 6, 10, 21.0, text_len=9)
    packed = _run_ours(ours, [cond, uncond, other])
    for out, item in zip(packed, [cond, uncond, other], strict=True):
        reference = _theirs(theirs, item.latents, item.timestep, item.text)
        assert _relative_error(out, reference) <= MAX_RELATIVE_ERROR
        (alone,) = _run_ours(ours, [item])
        assert _relative_error(out, alone) <= MAX_RELATIVE_ERROR
    assert _relative_error(packed[0], packed[1]) > 1e-3  # the text matters


def test_image_to_video_clean_first_frame_matches_expand_timesteps(models):
    ours, theirs = models
    item = _item(5, 3, 8, 8, 700.0, num_clean_frames=1)
    (out,) = _run_ours(ours, [item])
    reference = _theirs(theirs, item.latents, item.timestep, item.text, num_clean_frames=1)
    assert _relative_error(out, reference) <= MAX_RELATIVE_ERROR
    (no_mask,) = _run_ours(ours, [DiTInput(item.latents, item.timestep, item.text)])
    assert _relative_error(no_mask, reference) > 1e-3


def test_bad_latents_are_rejected(models):
    ours, _ = models
    with pytest.raises(ValueError, match="latents"):
        _run_ours(ours, [DiTInput(torch.zeros(3, 1, 4, 4), 1.0, torch.zeros(2, 16))])
