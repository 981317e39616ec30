"""Our LTX-2 pieces in a small loop against LTX2Pipeline / LTX2ImageToVideoPipeline loaded with
from_pretrained from the same tiny folder (written with save_pretrained): frames >= 40 dB PSNR and
the waveform >= 40 dB SNR, text-to-video and image-to-video, at the pipelines' guidance defaults
(classifier-free, spatio-temporal, modality and rescaled guidance on both streams)."""

import numpy as np
import pytest
import torch

from mstar.models.ltx2 import geometry
from mstar.models.ltx2.image import recompress
from mstar.models.ltx2.presets import TINY
from tests.models.ltx2.reference import psnr_db, snr_db
from tests.models.ltx2.tiny_loop import Request, generate, load_pieces

pytest.importorskip("diffusers")

MIN_DB = 40.0
PROMPT = "a robot dancing in the rain"
NEGATIVE = "the cat"


def _pipeline_call(pipe, request: Request, **extra):
    d = TINY.defaults
    with torch.no_grad():
        frames, audio = pipe(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt,
            height=request.height,
            width=request.width,
            num_frames=request.num_frames,
            frame_rate=request.frame_rate,
            num_inference_steps=request.num_inference_steps,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            max_sequence_length=d.max_sequence_length,
            output_type="np",
            return_dict=False,
            **extra,
        )
    return frames[0], audio[0]


@pytest.fixture(scope="module")
def pieces(tiny_folder):
    folder, _ = tiny_folder
    return load_pieces(folder)


def _image(height: int = 40, width: int = 56) -> np.ndarray:
    y = np.linspace(0, 255, height)[:, None, None]
    x = np.linspace(0, 120, width)[None, :, None]
    return np.broadcast_to(np.clip(y * 0.7 + x + np.array([0, 40, 80]), 0, 255), (height, width, 3)).astype(
        np.uint8
    )


def _check(ours, theirs, request: Request):
    frames, waveform = ours
    ref_frames, ref_waveform = theirs
    video = geometry.video_geometry(
        request.num_frames, request.height, request.width, request.frame_rate, TINY
    )
    audio = geometry.audio_geometry(request.num_frames, request.frame_rate, TINY)
    assert frames.shape == ref_frames.shape == (request.num_frames, request.height, request.width, 3)
    assert geometry.decoded_frames(video.latent_frames, TINY.vae) == request.num_frames
    assert (
        tuple(waveform.shape) == tuple(ref_waveform.shape) == (TINY.vocoder.out_channels, audio.num_samples)
    )
    assert psnr_db(frames, ref_frames) >= MIN_DB
    assert snr_db(waveform, ref_waveform) >= MIN_DB


def test_text_to_video_matches_the_pipeline(tiny_folder, pieces):
    from diffusers import LTX2Pipeline

    folder, _ = tiny_folder
    pipe = LTX2Pipeline.from_pretrained(str(folder))
    request = Request(prompt=PROMPT, negative_prompt=NEGATIVE, seed=3)
    _check(generate(pieces, request), _pipeline_call(pipe, request), request)


def test_image_to_video_matches_the_pipeline(tiny_folder, pieces):
    from diffusers import LTX2ImageToVideoPipeline
    from PIL import Image

    folder, _ = tiny_folder
    pipe = LTX2ImageToVideoPipeline.from_pretrained(str(folder))
    image = _image()
    request = Request(prompt=PROMPT, negative_prompt=NEGATIVE, seed=5, image=image)
    ours = generate(pieces, request)
    theirs = _pipeline_call(pipe, request, image=Image.fromarray(image))
    _check(ours, theirs, request)
    first = torch.from_numpy(ours[0][0])
    t2v_first = torch.from_numpy(
        generate(pieces, Request(prompt=PROMPT, negative_prompt=NEGATIVE, seed=5))[0][0]
    )
    assert snr_db(first, t2v_first) < 30  # the image conditions the first frame


def test_conditioning_image_recompression_matches_the_pipeline():
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf

    image = _image(33, 47)
    assert np.array_equal(recompress(image, 33), apply_image_conditioning_crf(image, 33))
    assert recompress(image, 33).shape == (32, 46, 3)
    assert recompress(image, 0) is image
