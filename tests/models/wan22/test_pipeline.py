"""A whole seeded generation through our nodes against diffusers' WanPipeline (tiny components, CPU).

The components are written by diffusers/transformers `save_pretrained` into a diffusers folder and
read back by our loaders; the prompt goes through the fallback tokenizer on both sides.
"""

import json

import numpy as np
import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState
from mstar.models.text_fallback import fallback_tokenizer
from mstar.models.wan22.config import WAN22_SCHEDULER, tiny_wan22_config
from mstar.models.wan22.model import Wan22Spec

diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

MIN_PSNR_DB = 40.0
SEED = 42


def _unipc_scheduler():
    return diffusers.UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=WAN22_SCHEDULER["flow_shift"],
        solver_order=2, num_train_timesteps=1000,
    )  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Tiny diffusers-layout folder and the diffusers pipeline built from the same components."""
    config = tiny_wan22_config()
    folder = tmp_path_factory.mktemp("wan22")
    torch.manual_seed(0)
    transformer = diffusers.WanTransformer3DModel(**config.dit.to_dict()).eval()
    vae = diffusers.AutoencoderKLWan(**config.vae).eval()
    text_encoder = transformers.UMT5EncoderModel(transformers.UMT5Config(**config.text_encoder)).eval()
    transformer.save_pretrained(folder / "transformer")
    vae.save_pretrained(folder / "vae")
    text_encoder.save_pretrained(folder / "text_encoder")
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    tokenizer = fallback_tokenizer(config.text_encoder["vocab_size"])
    pipe = diffusers.WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
        scheduler=_unipc_scheduler(), expand_timesteps=True,
    )  # fmt: skip
    return config, folder, pipe


def _psnr_db(ours: np.ndarray, theirs: np.ndarray) -> float:
    mse = float(np.mean((ours.astype(np.float64) - theirs.astype(np.float64)) ** 2))
    return 10 * np.log10(1.0 / max(mse, 1e-20))


def _build(config, folder):
    spec = Wan22Spec(config)
    ctx = BuildContext(
        config=ServerConfig(), device="cpu", node_names=spec.node_names, model_path=str(folder)
    )
    return spec, spec.build_nodes(ctx)


def _generate(spec, nodes, requests: list[RequestState]) -> list[np.ndarray]:
    """Runs the requests' walks stage by stage, batching every request at each node together."""
    walks = {r.request_id: spec.first_walk(r.params) for r in requests}
    while any(w is not None for w in walks.values()):
        for stage_index in range(max(len(spec.walks[w].stages) for w in walks.values() if w)):
            by_node: dict[str, list[RequestState]] = {}
            for request in requests:
                walk = walks[request.request_id]
                if walk is not None and stage_index < len(spec.walks[walk].stages):
                    stage = spec.walks[walk].stages[stage_index]
                    by_node.setdefault(getattr(stage, "node", stage), []).append(request)
            for name, batch in sorted(by_node.items(), key=lambda kv: kv[0] != "vae_encoder"):
                node = nodes[name]
                for request in batch:
                    node.prepare(request)
                active = list(batch)
                while active:
                    node.forward(active)
                    active = [r for r in active if not node.check_stop(r)]
                for request in batch:
                    node.release(request)
        walks = {r.request_id: spec.next_walk(r.params, walks[r.request_id]) for r in requests}
    frames = [r.tensors["frames"] for r in requests]
    for frame, request in zip(frames, requests, strict=True):
        p = request.params
        assert frame.dtype == torch.uint8 and frame.shape == (p.num_frames, p.height, p.width, 3)
    return [f.numpy() for f in frames]


def _run_ours(config, folder, params_in: GenerationParams, image=None) -> np.ndarray:
    spec, nodes = _build(config, folder)
    request = RequestState("r1", spec.validate(params_in))
    if image is not None:
        request.tensors["input_reference"] = torch.from_numpy(image)
    return _generate(spec, nodes, [request])[0]


@pytest.mark.parametrize("guidance", [5.0, 1.0])
def test_text_to_video_matches_wan_pipeline(checkpoint, guidance):
    config, folder, pipe = checkpoint
    prompt, negative = "a tiny red fox runs", "blurry"
    ours = _run_ours(
        config, folder,
        GenerationParams(prompt=prompt, negative_prompt=negative, width=32, height=48, num_frames=5,
                         num_inference_steps=4, guidance_scale=guidance, seed=SEED),
    )  # fmt: skip
    with torch.no_grad():
        theirs = pipe(
            prompt=prompt, negative_prompt=negative, height=48, width=32, num_frames=5, num_inference_steps=4,
            guidance_scale=guidance, generator=torch.Generator("cpu").manual_seed(SEED), output_type="np",
            max_sequence_length=config.max_text_tokens,
        ).frames[0]  # fmt: skip
    assert theirs.shape == ours.shape
    assert _psnr_db(ours / 255.0, theirs) >= MIN_PSNR_DB
    assert float(np.std(theirs)) > 1e-3  # not a constant picture


def test_image_to_video_matches_wan_i2v_pipeline(checkpoint):
    config, folder, pipe = checkpoint
    image = np.random.default_rng(0).integers(0, 256, size=(48, 32, 3), dtype=np.uint8)
    params = GenerationParams(
        prompt="a fox", width=32, height=48, num_frames=9, num_inference_steps=3, guidance_scale=4.0,
        seed=SEED, has_input_reference=True,
    )  # fmt: skip
    ours = _run_ours(config, folder, params, image=image)
    i2v = diffusers.WanImageToVideoPipeline(
        tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=_unipc_scheduler(),
        transformer=pipe.transformer, expand_timesteps=True,
    )  # fmt: skip
    from PIL import Image

    with torch.no_grad():
        # The i2v pipeline module needs ftfy to clean prompts; encode with the t2v pipeline instead.
        embeds, negative_embeds = pipe.encode_prompt("a fox", "", max_sequence_length=config.max_text_tokens)
        theirs = i2v(
            image=Image.fromarray(image), prompt_embeds=embeds, negative_prompt_embeds=negative_embeds, height=48, width=32, num_frames=9,
            num_inference_steps=3, guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(SEED),
            output_type="np", max_sequence_length=config.max_text_tokens,
        ).frames[0]  # fmt: skip
    assert _psnr_db(ours / 255.0, theirs) >= MIN_PSNR_DB


def test_requests_packed_together_match_each_alone(checkpoint):
    config, folder, _ = checkpoint
    spec, nodes = _build(config, folder)
    fields = [
        {"prompt": "a fox", "width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 3, "seed": 1},
        {"prompt": "a ship", "width": 48, "height": 32, "num_frames": 9, "num_inference_steps": 2,
         "guidance_scale": 1.0, "seed": 2},
    ]  # fmt: skip
    params = [spec.validate(GenerationParams(**f)) for f in fields]
    together = _generate(spec, nodes, [RequestState(f"r{i}", p) for i, p in enumerate(params)])
    for i, p in enumerate(params):
        (alone,) = _generate(spec, nodes, [RequestState(f"a{i}", p)])
        assert _psnr_db(together[i] / 255.0, alone / 255.0) >= 60.0


def test_random_weights_build_generates_and_is_seeded():
    config = tiny_wan22_config()
    spec = Wan22Spec(config)
    ctx = BuildContext(config=ServerConfig(), device="cpu", node_names=spec.node_names, random_weights=True)
    nodes = spec.build_nodes(ctx)
    fields = {"prompt": "seeded", "width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 2}
    params = spec.validate(GenerationParams(**fields, seed=7))
    first, again = (_generate(spec, nodes, [RequestState(f"r{i}", params)])[0] for i in range(2))
    assert np.array_equal(first, again)
    with pytest.raises(ValueError, match="random-weights"):
        spec.build_nodes(BuildContext(config=ServerConfig(), device="cpu", node_names=spec.node_names))
