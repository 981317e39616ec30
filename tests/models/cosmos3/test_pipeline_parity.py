"""Our Cosmos3 pieces driven by a small loop (tests/models/cosmos3/reference.py) against
Cosmos3OmniPipeline.from_pretrained on the same tiny folder (fp32, CPU): text-to-image,
text-to-video and image-to-video, with and without guidance; the understanding pathway runs once
per request and label, not once per step.

The contract is 40 dB; in float32 on the CPU the two agree to ~120 dB, so the tests hold 60 dB,
which a one-character prompt change or one step more (33-37 dB here) falls below."""

import numpy as np
import pytest
from PIL import Image

from tests.models.cosmos3.reference import LoopRequest, psnr_db, run_diffusers, run_our_loop

MIN_PSNR_DB = 60.0
NUM_STEPS = 3


def _image() -> Image.Image:
    """A conditioning image of another size and aspect (resized and centre-cropped)."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


CASES = {
    "text-to-image": LoopRequest("a red cube on a table", num_frames=1, height=32, width=48),
    "text-to-video": LoopRequest("a robot arm pours water", num_frames=5, height=32, width=32),
    "image-to-video": LoopRequest("the scene comes alive", num_frames=5, height=32, width=32, image=_image()),
}


@pytest.mark.parametrize("guidance_scale", [6.0, 1.0], ids=["guidance", "no-guidance"])
@pytest.mark.parametrize("mode", list(CASES))
def test_our_loop_matches_the_pipeline(edge_folder, mode, guidance_scale):
    folder, pipe = edge_folder
    request = CASES[mode]
    request = LoopRequest(
        **{**request.__dict__, "guidance_scale": guidance_scale, "num_inference_steps": NUM_STEPS}
    )
    ours = run_our_loop(folder, request)
    theirs = run_diffusers(pipe, request)
    assert ours.frames.shape == theirs.shape
    assert psnr_db(ours.frames, theirs) >= MIN_PSNR_DB
    num_labels = 2 if guidance_scale != 1.0 else 1
    assert ours.num_generation_forwards == NUM_STEPS
    assert ours.num_understanding_forwards == num_labels  # diffusers runs it NUM_STEPS * num_labels times


def test_recipe_flow_shift_and_negative_prompt_on_a_karras_folder(nano_folder):
    """Nano-like backbone, the system prompt, a negative prompt; the folder's Karras schedule as
    saved, then a recipe's flow shift replacing it as the published examples do."""
    folder, pipe = nano_folder
    for flow_shift in (None, 12.0):
        request = LoopRequest(
            "a dog runs", num_frames=5, height=48, width=32, negative_prompt="blurry", flow_shift=flow_shift
        )
        ours = run_our_loop(folder, request)
        assert psnr_db(ours.frames, run_diffusers(pipe, request)) >= MIN_PSNR_DB
        assert ours.num_understanding_forwards == 2
