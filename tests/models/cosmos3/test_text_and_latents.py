"""The text side and the initial latents against Cosmos3OmniPipeline's own steps (tokenize_prompt,
_preprocess_conditioning_image, prepare_latents) on the tiny folders."""

import numpy as np
import pytest
import torch
from PIL import Image

from mstar.models.cosmos3.conditioning import encode_image, initial_latents, preprocess_image
from mstar.models.cosmos3.config import Cosmos3Config
from mstar.models.cosmos3.geometry import NUM_PROMPT_SUFFIX_TOKENS, latent_shape
from mstar.models.cosmos3.text import PromptRequest, augmented_text, load_tokenizer, prompt_token_ids
from mstar.models.cosmos3.weights import load_vae

REQUESTS = [
    PromptRequest("a robot arm pours water.", num_frames=121, height=480, width=832),
    PromptRequest("a cat", num_frames=1, height=640, width=640, negative_prompt="blurry, low quality"),
    PromptRequest("", num_frames=33, height=704, width=1280, fps=16.0, negative_prompt=""),
    PromptRequest(
        "x", num_frames=9, height=32, width=32, add_duration_template=False, add_resolution_template=False
    ),
]


@pytest.mark.parametrize("request_index", range(len(REQUESTS)))
@pytest.mark.parametrize("use_system_prompt", [True, False])
def test_prompt_ids_equal_the_pipelines(edge_folder, request_index, use_system_prompt):
    folder, pipe = edge_folder
    request = REQUESTS[request_index]
    ours = prompt_token_ids(load_tokenizer(folder), request, use_system_prompt)
    theirs = pipe.tokenize_prompt(
        request.prompt,
        request.negative_prompt,
        num_frames=request.num_frames,
        height=request.height,
        width=request.width,
        fps=request.fps,
        use_system_prompt=use_system_prompt,
        add_resolution_template=request.add_resolution_template,
        add_duration_template=request.add_duration_template,
    )
    assert (ours.cond, ours.uncond) == theirs
    tokenizer = pipe.text_tokenizer
    assert ours.cond[-NUM_PROMPT_SUFFIX_TOKENS:] == [
        tokenizer.eos_token_id,
        tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    ]


def test_metadata_sentences():
    video = PromptRequest("A dog.", num_frames=121, height=480, width=832, negative_prompt="blur")
    assert augmented_text(video, negative=False) == (
        "A dog. The video is 5.0 seconds long and is of 24 FPS. This video is of 480x832 resolution."
    )
    assert augmented_text(video, negative=True) == (
        "blur. The video is not 5.0 seconds long and is not of 24 FPS. This video is not of 480x832 resolution."
    )
    image = PromptRequest("A dog", num_frames=1, height=640, width=640)
    assert augmented_text(image, negative=True) == "This image is not of 640x640 resolution."


def _picture(height: int, width: int, seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize(
    ("source", "target"), [((40, 56), (32, 32)), ((30, 30), (32, 48)), ((64, 32), (48, 32))]
)
def test_image_preprocessing_equals_the_pipelines(source, target):
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image

    image = _picture(*source, seed=1)
    ours = preprocess_image(image, *target)
    assert torch.equal(ours, _preprocess_conditioning_image(image, *target))
    as_tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    assert torch.equal(preprocess_image(as_tensor, *target), ours)
    assert torch.equal(preprocess_image(np.array(image), *target), ours)


@pytest.mark.parametrize("with_image", [False, True], ids=["text-to-video", "image-to-video"])
def test_initial_latents_equal_prepare_latents(edge_folder, with_image):
    folder, pipe = edge_folder
    config = Cosmos3Config.from_folder(folder)
    image = _picture(40, 56, seed=2) if with_image else None
    num_frames, height, width = 9, 32, 48
    with torch.no_grad():
        theirs = pipe.prepare_latents(
            image=image,
            num_frames=num_frames,
            height=height,
            width=width,
            generator=torch.Generator("cpu").manual_seed(5),
            device="cpu",
            dtype=torch.float32,
        )[0][0]
        image_latents = None
        if with_image:
            image_latents = encode_image(load_vae(folder, "cpu", torch.float32, part="encoder"),
                                         preprocess_image(image, height, width))  # fmt: skip
        ours = initial_latents(latent_shape(config.vae, num_frames, height, width), 5, image_latents)
    assert ours.shape == theirs.shape
    assert torch.equal(ours[:, 1:], theirs[:, 1:])  # the noise, drawn as diffusers draws it
    # frame 0: the noise, or the image encoded alone against the whole repeated clip encoded
    torch.testing.assert_close(ours[:, :1], theirs[:, :1], rtol=1e-5, atol=1e-5)


def test_a_bad_image_is_refused():
    with pytest.raises(ValueError, match="one RGB image"):
        preprocess_image(torch.zeros(4, 8, 8, dtype=torch.uint8), 8, 8)
    with pytest.raises(ValueError, match="uint8"):
        preprocess_image(torch.zeros(3, 8, 8), 8, 8)
