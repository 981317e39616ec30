"""Per-request LoRA through Z-Image's served nodes (tiny save_pretrained folder, CPU) against
diffusers' ZImagePipeline with load_lora_weights + set_adapters for each request alone: requests
with different adapters, scales, sizes and guidance, and one with none, share every packed step;
the one with none is byte-identical to a server without lora_dir."""

import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext
from mstar.models.zimage.config import TINY
from mstar.models.zimage.model import ZImageSpec
from mstar.params import LoraChoice
from tests.lora_files import WaitingForAdapters, linear_names, save_peft_adapter
from tests.lora_files import psnr_db as latent_psnr_db
from tests.models.zimage.test_generation import generate, pipeline_image, psnr_db, request
from tests.models.zimage.tiny_parts import tiny_transformer

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")

MIN_PSNR_DB = 40.0
B_STD = 1.0  # updates that move each request's latents far past MIN_PSNR_DB: matching says applied
# request id -> (adapters, its other params): sizes and guidance differ, so segments do too
REQUESTS = {
    "r0": ([("a", 0.8)], {"guidance_scale": 1.5, "negative_prompt": "dark"}),
    "r1": ([("b", -0.7)], {"width": 32, "height": 56}),
    "r2": ([("c", 1.0), ("a", 0.4)], {"prompt": "a green tree"}),
    "r3": ([], {"width": 64, "height": 32}),
}


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """Three adapters: every Linear (the timestep embedder and adaLN rows included), the attention
    only (rank 8), the feed-forwards and the caption path only (rank 2)."""
    folder = tmp_path_factory.mktemp("zimage-lora-dir")
    model = tiny_transformer()
    names = linear_names(model)
    mixin = diffusers.loaders.ZImageLoraLoaderMixin
    paths = {
        "a": save_peft_adapter(model, mixin, folder, "a", names, seed=1, b_std=B_STD),
        "b": save_peft_adapter(
            model, mixin, folder, "b", [n for n in names if "attention" in n], seed=2, r=8, b_std=B_STD
        ),
        "c": save_peft_adapter(
            model,
            mixin,
            folder,
            "c",
            [n for n in names if "feed_forward" in n or "cap_" in n],
            seed=3,
            r=2,
            b_std=B_STD,
        ),
    }
    return folder, paths


def _nodes(model_folder, lora_dir=None, wake=None):
    spec = ZImageSpec(TINY)
    config = ServerConfig(
        model="z-image-turbo",
        compile_mode="off",
        warmup=False,
        lora_dir=None if lora_dir is None else str(lora_dir),
    )
    ctx = BuildContext(
        config=config, device="cpu", node_names=spec.node_names, model_path=str(model_folder), wake=wake
    )
    nodes = spec.build_nodes(ctx)
    return {**nodes, "dit": WaitingForAdapters(nodes["dit"])}


def _requests(with_adapters: bool):
    requests = []
    for index, (rid, (adapters, params)) in enumerate(REQUESTS.items()):
        lora = tuple(LoraChoice(n, s) for n, s in adapters) if with_adapters else ()
        fields = {"num_inference_steps": 3, "seed": 40 + index, "guidance_scale": 0.0, "lora": lora}
        requests.append(request(rid, **{**fields, **params}))
    return requests


def test_four_requests_three_adapter_sets_and_none_share_steps(tiny_folder, lora_dir):
    model_folder, pipe = tiny_folder
    adapters_folder, paths = lora_dir
    ours = _requests(with_adapters=True)
    latents = dict(zip(REQUESTS, generate(_nodes(model_folder, adapters_folder), ours), strict=True))
    plain = _requests(with_adapters=False)
    plain_latents = dict(zip(REQUESTS, generate(_nodes(model_folder), plain), strict=True))
    frames = {r.request_id: r.tensors["frames"][0].numpy() for r in ours}
    assert torch.equal(latents["r3"], plain_latents["r3"]), (
        "no adapter: the bytes of a server without lora_dir"
    )
    assert (frames["r3"] == plain[3].tensors["frames"][0].numpy()).all()
    for name, path in paths.items():
        pipe.load_lora_weights(path, adapter_name=name)
    try:
        for state in ours:
            rid, adapters = state.request_id, REQUESTS[state.request_id][0]
            if adapters:
                pipe.enable_lora()
                pipe.set_adapters([n for n, _ in adapters], [s for _, s in adapters])
            else:
                pipe.disable_lora()
            assert psnr_db(frames[rid], pipeline_image(pipe, state.params)) >= MIN_PSNR_DB, rid
            expected = pipeline_image(pipe, state.params, output_type="latent")
            assert latent_psnr_db(latents[rid], expected) >= MIN_PSNR_DB, rid
            if adapters:  # so matching diffusers says the adapters were applied
                assert latent_psnr_db(plain_latents[rid], expected) < MIN_PSNR_DB - 10, rid
    finally:
        pipe.unload_lora_weights()


def test_an_adapter_for_another_model_fails_its_request_alone(tiny_folder, lora_dir, tmp_path):
    """A Wan adapter in the folder: its request's readiness raises, naming the module; a request
    with a good adapter in the same server goes on."""
    import shutil

    from tests.lora_files import write_adapter

    model_folder, _ = tiny_folder
    adapters_folder, _ = lora_dir
    shutil.copytree(adapters_folder, tmp_path / "loras")
    write_adapter(
        str(tmp_path / "loras" / "wan.safetensors"),
        {
            "transformer.blocks.0.attn1.to_q.lora_A.weight": torch.randn(4, 32),
            "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.randn(32, 4),
        },
    )
    nodes = _nodes(model_folder, tmp_path / "loras")
    bad = request("bad", num_inference_steps=2, guidance_scale=0.0, seed=1, lora=(LoraChoice("wan"),))
    good = request("good", num_inference_steps=2, guidance_scale=0.0, seed=2, lora=(LoraChoice("a", 0.5),))
    nodes["text_encoder"].forward([bad, good])
    dit = nodes["dit"].node
    for state in (bad, good):
        dit.prepare(state)
    with pytest.raises(RuntimeError, match="blocks.0.attn1.to_q"):
        WaitingForAdapters(dit).forward([bad])
    dit.release(bad)
    WaitingForAdapters(dit).forward([good])
    dit.release(good)


def test_a_finished_load_wakes_the_step_loop(tiny_folder, lora_dir):
    """The worker's wake (BuildContext.wake) is called from the loader thread once a request's
    adapter is read, so the request starts without waiting for the idle poll."""
    import threading

    woken = threading.Event()
    nodes = _nodes(tiny_folder[0], lora_dir[0], wake=woken.set)
    state = request("w", num_inference_steps=2, guidance_scale=0.0, seed=3, lora=(LoraChoice("b"),))
    nodes["text_encoder"].forward([state])
    dit = nodes["dit"].node
    dit.prepare(state)
    assert woken.wait(60)  # a hang guard: tiny adapters load in milliseconds
    assert dit.ready(state)
    dit.release(state)
