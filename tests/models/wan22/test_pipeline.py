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


def _run_ours(config, folder, params_in: GenerationParams) -> np.ndarray:
    spec = Wan22Spec(config)
    params = spec.validate(params_in)
    ctx = BuildContext(
        config=ServerConfig(), device="cpu", node_names=spec.node_names, model_path=str(folder)
    )
    nodes = spec.build_nodes(ctx)
    request = RequestState("r1", params)
    walk = spec.first_walk(params)
    while walk is not None:
        for stage in spec.walks[walk].stages:
            node = nodes[stage.node if hasattr(stage, "node") else stage]
            node.prepare(request)
            node.forward([request])
            while not node.check_stop(request):
                node.forward([request])
            node.release(request)
        walk = spec.next_walk(params, walk)
    frames = request.tensors["frames"]
    assert frames.dtype == torch.uint8 and frames.shape == (
        params["num_frames"],
        params["height"],
        params["width"],
        3,
    )
    return frames.numpy()


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
