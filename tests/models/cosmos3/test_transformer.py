"""Our Cosmos3 transformer against diffusers' Cosmos3OmniTransformer with the same weights (tiny
configs, fp32, CPU): the understanding pathway run once, then the generation pathway at every
step, equals diffusers' full forward that recomputes the understanding pathway each time; many
requests packed in one generation forward equal each alone."""

import math

import pytest
import torch

from mstar.engine.attention import PrefixAttention, StackedPrefixKV, build_attention
from mstar.models.cosmos3.transformer import VisionInput
from mstar.models.cosmos3.weights import load_transformer
from tests.models.cosmos3.reference import diffusers_velocity

MIN_SNR_DB = 60.0
TIMESTEPS = (999.0, 640.0, 37.0)


def snr_db(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    error = float((ours.double() - theirs.double()).norm())
    return math.inf if error == 0 else 20 * math.log10(float(theirs.double().norm()) / error)


@pytest.fixture(scope="module", params=["edge", "nano"])
def models(request, edge_folder, nano_folder):
    folder, pipe = edge_folder if request.param == "edge" else nano_folder
    ours = load_transformer(folder, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    return ours, pipe.transformer, attention, PrefixAttention(attention)


def _latents(seed: int, frames: int, height: int, width: int) -> torch.Tensor:
    return torch.randn(16, frames, height, width, generator=torch.Generator().manual_seed(seed))


def _ids(seed: int, count: int) -> list[int]:
    return torch.randint(0, 260, (count,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("clean_frames", [(), (0,)], ids=["text-to-video", "image-to-video"])
def test_understanding_once_then_generation_per_step_matches_the_full_forward(models, clean_frames):
    ours, theirs, attention, dense = models
    ids = _ids(1, 23)
    latents = _latents(2, 3, 5, 6)  # odd latent height: padded to the 2x2 patch, as diffusers
    with torch.no_grad():
        prefix = ours.understand(ids, attention)
        before = ours.num_understanding_forwards
        for timestep in TIMESTEPS:
            (out,) = ours.generate(
                [VisionInput(latents, timestep, 24.0, clean_frames)], StackedPrefixKV([prefix]), dense
            )
            reference = diffusers_velocity(theirs, ids, latents, timestep, clean_frames=clean_frames)
            assert out.shape == latents.shape
            assert snr_db(out, reference) >= MIN_SNR_DB
            if clean_frames:
                assert torch.count_nonzero(out[:, 0]) == 0  # no prediction for the conditioning frame
    assert ours.num_understanding_forwards == before  # the generation pathway never re-runs it
    assert prefix.shape == (2, 2, len(ids), 2, 16)  # [layers, keys/values, L, Hkv, D]


def test_a_single_image_and_other_fps_match(models):
    ours, theirs, attention, dense = models
    ids = _ids(3, 9)
    with torch.no_grad():
        prefix = StackedPrefixKV([ours.understand(ids, attention)])
        for latents, fps in ((_latents(4, 1, 4, 6), 24.0), (_latents(5, 2, 4, 4), 16.0)):
            (out,) = ours.generate([VisionInput(latents, 500.0, fps)], prefix, dense)
            assert snr_db(out, diffusers_velocity(theirs, ids, latents, 500.0, fps=fps)) >= MIN_SNR_DB


def _requests():
    """Three requests of different sizes, frame counts and modes; the first two with guidance."""
    video = (_ids(6, 17), _ids(7, 12), _latents(8, 3, 4, 6), 810.0, ())  # (cond ids, uncond ids, ...)
    still = (_ids(9, 21), None, _latents(10, 1, 6, 4), 400.0, ())
    clip = (_ids(11, 8), _ids(12, 26), _latents(13, 2, 6, 6), 130.0, (0,))
    return [video, still, clip]


def test_requests_packed_in_one_forward_equal_each_alone_and_diffusers(models):
    ours, theirs, attention, dense = models
    items, prefixes, prompts = [], [], []
    with torch.no_grad():
        for cond, uncond, latents, timestep, clean in _requests():
            for ids in (cond, uncond):
                if ids is not None:
                    items.append(VisionInput(latents, timestep, 24.0, clean))
                    prefixes.append(ours.understand(ids, attention))
                    prompts.append(ids)
        packed = ours.generate(items, StackedPrefixKV(prefixes), dense)
        for out, item, prefix, ids in zip(packed, items, prefixes, prompts, strict=True):
            (alone,) = ours.generate([item], StackedPrefixKV([prefix]), dense)
            assert snr_db(out, alone) >= 100.0  # an item's output does not depend on its company
            reference = diffusers_velocity(
                theirs, ids, item.latents, item.timestep, clean_frames=item.clean_frames
            )
            assert snr_db(out, reference) >= MIN_SNR_DB
    assert snr_db(packed[0], packed[1]) < 20.0  # same latents, other prompt: the prefix matters


def test_prefix_of_a_prompt_does_not_depend_on_anything_else(models):
    ours, _, attention, _ = models
    ids = _ids(14, 15)
    with torch.no_grad():
        first = ours.understand(ids, attention)
        ours.understand(_ids(15, 40), attention)
        assert torch.equal(ours.understand(ids, attention), first)


def test_bad_inputs_are_rejected(models):
    ours, _, attention, dense = models
    with torch.no_grad():
        prefix = StackedPrefixKV([ours.understand(_ids(16, 5), attention)])
        with pytest.raises(ValueError, match="latents must be"):
            ours.generate([VisionInput(torch.zeros(3, 1, 4, 4), 1.0)], prefix, dense)
        with pytest.raises(ValueError, match="2 items but 1 prefixes"):
            ours.generate([VisionInput(_latents(17, 1, 4, 4), 1.0)] * 2, prefix, dense)
        with pytest.raises(ValueError, match="no tokens"):
            ours.understand([], attention)
