"""LTX-2 through its nodes: against LTX2Pipeline / LTX2ImageToVideoPipeline loaded from the same tiny
save_pretrained folder (frames >= 40 dB PSNR, waveform >= 40 dB SNR), one request alone and packed
with others of other sizes and durations (byte-identical on CPU fp32), the spec's limits."""

import msgspec
import numpy as np
import pytest
import torch

from mstar.config import ServerConfig
from mstar.errors import InvalidParam
from mstar.graph import GenerationParams
from mstar.models.ltx2 import geometry
from mstar.models.ltx2.presets import TINY
from tests.models.ltx2.reference import psnr_db, snr_db
from tests.models.ltx2.served import build_nodes, decode, denoise, final_latents, new_request
from tests.models.ltx2.tiny_spec import TinyLTX2Spec

MIN_DB = 40.0
PROMPT = "a robot dancing in the rain"
NEGATIVE = "the cat"


def _fields(**overrides):
    """A validated tiny request's fields (the pipeline's defaults), with overrides."""
    params = TinyLTX2Spec().validate(GenerationParams(prompt=PROMPT, negative_prompt=NEGATIVE, seed=3))
    return {**msgspec.structs.asdict(params), **overrides}


def _image(height: int = 40, width: int = 56) -> np.ndarray:
    y = np.linspace(0, 255, height)[:, None, None]
    x = np.linspace(0, 120, width)[None, :, None]
    pixels = np.clip(y * 0.7 + x + np.array([0, 40, 80]), 0, 255)
    return np.broadcast_to(pixels, (height, width, 3)).astype(np.uint8)


@pytest.fixture(scope="module")
def folder_nodes(tiny_folder):
    folder, _ = tiny_folder
    return build_nodes(TinyLTX2Spec(), str(folder))


def _pipeline_outputs(pipe, fields, image=None):
    from PIL import Image

    extra = {} if image is None else {"image": Image.fromarray(image)}
    with torch.no_grad():
        frames, audio = pipe(
            prompt=fields["prompt"], negative_prompt=fields["negative_prompt"], height=fields["height"],
            width=fields["width"], num_frames=fields["num_frames"], frame_rate=float(fields["fps"]),
            num_inference_steps=fields["num_inference_steps"],
            generator=torch.Generator("cpu").manual_seed(fields["seed"]),
            max_sequence_length=TINY.defaults.max_sequence_length, output_type="np", return_dict=False, **extra,
        )  # fmt: skip
    return frames[0], audio[0]


@pytest.mark.parametrize("image_to_video", [False, True], ids=["t2v", "i2v"])
def test_served_nodes_match_the_pipeline(tiny_folder, folder_nodes, image_to_video):
    from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

    folder, _ = tiny_folder
    pipeline_class = LTX2ImageToVideoPipeline if image_to_video else LTX2Pipeline
    pipe = pipeline_class.from_pretrained(str(folder))
    image = _image() if image_to_video else None
    fields = _fields(seed=5)
    request = new_request(TinyLTX2Spec(), "r", image=image, **fields)
    denoise(folder_nodes, [request])
    frames, waveform = decode(folder_nodes, request)
    ref_frames, ref_waveform = _pipeline_outputs(pipe, fields, image)
    audio = geometry.audio_geometry(fields["num_frames"], fields["fps"], TINY)
    assert (
        frames.shape == (fields["num_frames"], fields["height"], fields["width"], 3)
        and frames.dtype == torch.uint8
    )
    assert (
        tuple(waveform.shape) == tuple(ref_waveform.shape) == (TINY.vocoder.out_channels, audio.num_samples)
    )
    assert psnr_db(frames.numpy() / 255.0, ref_frames) >= MIN_DB
    assert snr_db(waveform, ref_waveform.float()) >= MIN_DB


def test_a_request_packed_with_others_is_byte_identical_to_alone():
    """Other sizes, durations, frame rates and guidance (one with a single pass, one image-to-video)
    share every step; fp32 on the CPU gives the same bytes for both streams."""
    spec = TinyLTX2Spec()
    nodes = build_nodes(spec, names=("text_encoder", "vae_encoder", "dit"))
    target = _fields(width=64, height=64, num_frames=9, fps=8, seed=11)
    companions = [
        _fields(width=32, height=64, num_frames=5, fps=12, guidance_scale=1.0, audio_guidance_scale=1.0,
                modality_scale=1.0, audio_modality_scale=1.0, seed=5),
        _fields(width=96, height=32, num_frames=17, fps=8, seed=6, prompt="the dog sings"),
    ]  # fmt: skip
    alone = new_request(spec, "alone", **target)
    denoise(nodes, [alone])
    packed = new_request(spec, "packed", **target)
    others = [
        new_request(spec, "c0", **companions[0]),
        new_request(spec, "c1", image=_image(), **companions[1]),
    ]
    denoise(nodes, [others[0], packed, others[1]])
    assert spec.labels(others[0].params) == (geometry.COND,)
    for mine, theirs in zip(final_latents(alone), final_latents(packed), strict=True):
        assert torch.equal(mine, theirs)
    assert not torch.equal(final_latents(others[1])[0][:, :1], final_latents(alone)[0][:, :1])


def test_text_keys_and_values_past_the_kept_budget_give_the_same_bytes():
    """kept_text_mb=0: every step projects the texts again (none kept) and gives the latents the
    default budget gives, where each text is projected once and kept."""
    spec = TinyLTX2Spec()
    runs = []
    for kept_text_mb in (ServerConfig().kept_text_mb, 0):
        nodes = build_nodes(spec, names=("text_encoder", "dit"), kept_text_mb=kept_text_mb)
        requests = [
            new_request(spec, "a", **_fields(width=64, height=32, num_frames=9, seed=1)),
            new_request(
                spec, "b", **_fields(width=32, height=32, num_frames=5, seed=2, prompt="the dog sings")
            ),
        ]
        denoise(nodes, requests)
        kept = nodes["dit"].kept
        runs.append(([final_latents(request) for request in requests], kept.num_refused, kept.num_bytes))
    (kept_latents, kept_refused, kept_left), (none_latents, none_refused, none_left) = runs
    assert kept_refused == 0 and none_refused > 0 and kept_left == none_left == 0
    for mine, theirs in zip(kept_latents, none_latents, strict=True):
        for stream, other in zip(mine, theirs, strict=True):
            assert torch.equal(stream, other)


def test_limits_and_validation_name_the_field():
    spec = TinyLTX2Spec()
    params = spec.validate(GenerationParams(prompt="a cat"))
    d = TINY.defaults
    assert (params.width, params.height, params.num_frames, params.fps) == (
        d.width,
        d.height,
        d.num_frames,
        8,
    )
    assert params.audio and params.guidance_scale == 3.0 and params.audio_guidance_scale == 7.0
    assert spec.labels(params) == (geometry.COND, geometry.UNCOND, geometry.ISOLATED)
    assert spec.audio_sample_rate(params) == TINY.vocoder.output_sampling_rate
    silent = spec.validate(GenerationParams(prompt="a cat", audio=False))
    assert spec.audio_sample_rate(silent) is None and spec.next_walk(silent, "encode_text") == "t2v_silent"
    for field, bad in [("width", {"width": 48}), ("num_frames", {"num_frames": 8}), ("fps", {"fps": 0}),
                       ("num_inference_steps", {"num_inference_steps": 1}), ("audio", {"audio": "yes"}),
                       ("seconds", {"seconds": 2.0, "num_frames": 9})]:  # fmt: skip
        with pytest.raises(InvalidParam) as error:
            spec.validate(GenerationParams(prompt="a cat", **bad))
        assert error.value.param == field
    assert spec.validate(GenerationParams(prompt="a cat", seconds=2.0, fps=8)).num_frames == 17
    video, audio = spec.num_tokens(params)
    assert spec.step_tokens(params) == (video + audio) * 3


def test_boot_warmup_packs_a_guided_step_with_its_isolated_item():
    """Isolated items skip the audio-video cross attention, so a pack whose cross part is shorter
    than the whole is a graph of its own: the boot warmup packs one and two items, then a request's
    guided step at the defaults, so that a request's first step compiles nothing."""
    from mstar.config import CompileSize
    from mstar.diffusion.denoise import DenoiseNode
    from mstar.models.ltx2.pipeline import LTX2Pipeline

    packs = []

    class RecordingDiT:
        keeps_text_kv = False  # no text keys and values to keep

        def __call__(self, inputs, attention, stg_blocks):
            packs.append([item.isolated for item in inputs])
            return [(item.video_latents, item.audio_latents) for item in inputs]

    pipeline = LTX2Pipeline(TINY, "cpu", torch.float32, dit=RecordingDiT())
    DenoiseNode(pipeline, warmup_sizes=[CompileSize(width=64, height=32, num_frames=9)]).warmup()
    assert TinyLTX2Spec().labels(TinyLTX2Spec().validate(GenerationParams(prompt="p"))) == (
        geometry.COND, geometry.UNCOND, geometry.ISOLATED
    )  # fmt: skip
    assert packs == [[False], [False, False], [False, False, True]]


@pytest.mark.slow
def test_after_the_boot_warmup_guided_steps_compile_nothing():
    """The compiled DiT (fused projections, bf16) warmed as at boot: a request's guided step, two
    requests of two sizes, and image-to-video's clean first frame then run without a recompile."""
    from dataclasses import replace

    from mstar.config import CompileSize
    from mstar.diffusion.denoise import DenoiseNode
    from mstar.engine.attention import build_attention
    from mstar.models.ltx2 import weights
    from mstar.models.ltx2.optimize import optimize
    from mstar.models.ltx2.pipeline import REQUEST, LTX2Pipeline
    from mstar.models.scaffold import speed_up

    dtype = torch.bfloat16
    dit, compiled = speed_up(
        weights.build_dit(TINY.dit, "cpu", dtype), optimize, True, False, "deterministic", "test.ltx2"
    )
    pipeline = LTX2Pipeline(TINY, "cpu", dtype, dit=dit, attention=build_attention("torch", "cpu", dtype))
    sizes = [CompileSize(width=64, height=32, num_frames=9), CompileSize(width=32, height=64, num_frames=17)]
    DenoiseNode(pipeline, compiled=compiled, warmup_sizes=sizes[:1]).warmup()

    def guided_step(size, num_clean_frames=0):
        item = pipeline.warmup_item(size)
        setup = replace(item.condition[REQUEST], num_clean_frames=num_clean_frames)
        return [
            replace(item, label=label, timestep=700.0, condition={REQUEST: setup})
            for label in (geometry.COND, geometry.UNCOND, geometry.ISOLATED)
        ]

    with torch.inference_mode():
        pipeline.predict(guided_step(sizes[0]))
        pipeline.predict(guided_step(sizes[0]) + guided_step(sizes[1]))
        pipeline.predict(guided_step(sizes[1], num_clean_frames=1))
    assert compiled.num_recompiles == 0
