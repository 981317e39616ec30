"""Per-request LoRA through FLUX.2 [klein]'s served nodes (tiny save_pretrained folder, CPU) against
diffusers' Flux2KleinPipeline with load_lora_weights + set_adapters for each request alone: requests
with different adapters, scales, sizes and an edit with reference images, and one with none, share
every packed step; the one with none is byte-identical to a server without lora_dir."""

import msgspec
import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext
from mstar.models.flux2_klein.vae import unpatchify
from mstar.params import LoraChoice
from tests.lora_files import WaitingForAdapters, linear_names, save_peft_adapter
from tests.lora_files import psnr_db as latent_psnr_db
from tests.models.flux2_klein.test_generation import psnr_db, reference_images
from tests.models.flux2_klein.test_serving import frames_01, generate, make_request, pipeline_image
from tests.models.flux2_klein.tiny_parts import TinyFlux2KleinSpec, pipeline_call_kwargs, tiny_transformer

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")

MIN_PSNR_DB = 40.0
B_STD = 1.0  # updates that move each request's latents far past MIN_PSNR_DB: matching says applied
# Run once per distinct timestep outside the pack: no LoRA (an adapter on them is refused).
PER_TIMESTEP = ("time_guidance_embed", "modulation", "norm_out")
# request id -> (adapters, its params, whether it edits the reference images)
REQUESTS = {
    "r0": ([("a", 0.8)], {"width": 48, "height": 64}, False),
    "r1": ([("b", -0.7)], {}, True),
    "r2": ([("c", 1.0), ("a", 0.4)], {"width": 32, "height": 32, "prompt": "a red bicycle"}, False),
    "r3": ([], {"width": 48, "height": 48}, False),
}


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """Three adapters: every Linear of the packed step, the attention only (rank 8), the FFNs and
    the text embedder only (rank 2)."""
    folder = tmp_path_factory.mktemp("flux2-lora-dir")
    model = tiny_transformer()
    names = [n for n in linear_names(model) if not any(part in n for part in PER_TIMESTEP)]
    mixin = diffusers.loaders.Flux2LoraLoaderMixin
    paths = {
        "a": save_peft_adapter(model, mixin, folder, "a", names, seed=1, b_std=B_STD),
        "b": save_peft_adapter(
            model, mixin, folder, "b", [n for n in names if ".attn." in n], seed=2, r=8, b_std=B_STD
        ),
        "c": save_peft_adapter(
            model,
            mixin,
            folder,
            "c",
            [n for n in names if ".ff" in n or "context_embedder" in n],
            seed=3,
            r=2,
            b_std=B_STD,
        ),
    }
    return folder, paths


def _nodes(model_folder, lora_dir=None):
    spec = TinyFlux2KleinSpec()
    config = ServerConfig(
        model=spec.name,
        compile_mode="off",
        warmup=False,
        lora_dir=None if lora_dir is None else str(lora_dir),
    )
    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, model_path=str(model_folder))
    nodes = spec.build_nodes(ctx)
    return {**nodes, "dit": WaitingForAdapters(nodes["dit"])}


def _request(rid, adapters, images=(), **fields):
    state = make_request(TinyFlux2KleinSpec(), rid, images, **fields)
    lora = tuple(LoraChoice(name, scale) for name, scale in adapters)
    state.params = msgspec.structs.replace(state.params, lora=lora)
    return state


def _requests(with_adapters: bool):
    requests = []
    for index, (rid, (adapters, params, edits)) in enumerate(REQUESTS.items()):
        fields = {"prompt": "a lighthouse", "num_inference_steps": 3, "seed": 20 + index, **params}
        images = reference_images() if edits else ()
        requests.append(_request(rid, adapters if with_adapters else [], images, **fields))
    return requests


def _vae_latents(nodes, latents: torch.Tensor) -> torch.Tensor:
    """Our final latents [128, h, w] as the pipeline's "latent" output: denormalised, unpatchified."""
    vae = nodes["vae_decoder"].pipeline.vae
    return unpatchify(vae.bn.denormalize(latents[None]))[0]


def test_four_requests_three_adapter_sets_and_none_share_steps(tiny_folder, lora_dir):
    model_folder, pipe = tiny_folder
    adapters_folder, paths = lora_dir
    nodes = _nodes(model_folder, adapters_folder)
    ours = _requests(with_adapters=True)
    latents = dict(zip(REQUESTS, generate(nodes, ours), strict=True))
    plain = _requests(with_adapters=False)
    plain_latents = dict(zip(REQUESTS, generate(_nodes(model_folder), plain), strict=True))
    assert torch.equal(latents["r3"], plain_latents["r3"]), (
        "no adapter: the bytes of a server without lora_dir"
    )
    assert torch.equal(ours[3].tensors["frames"], plain[3].tensors["frames"])
    for name, path in paths.items():
        pipe.load_lora_weights(path, adapter_name=name)
    try:
        for state in ours:
            rid, (adapters, _, edits) = state.request_id, REQUESTS[state.request_id]
            if adapters:
                pipe.enable_lora()
                pipe.set_adapters([n for n, _ in adapters], [s for _, s in adapters])
            else:
                pipe.disable_lora()
            images = reference_images() if edits else None
            expected = torch.from_numpy(pipeline_image(pipe, state.params, images))
            assert psnr_db(torch.from_numpy(frames_01(state)), expected) >= MIN_PSNR_DB, rid
            expected = pipeline_latents(pipe, state.params, images)
            assert latent_psnr_db(_vae_latents(nodes, latents[rid]), expected) >= MIN_PSNR_DB, rid
            if adapters:  # so matching diffusers says the adapters were applied
                assert latent_psnr_db(_vae_latents(nodes, plain_latents[rid]), expected) < MIN_PSNR_DB - 10, (
                    rid
                )
    finally:
        pipe.unload_lora_weights()


def pipeline_latents(pipe, params, images=None) -> torch.Tensor:
    """The pipeline's "latent" output [C, H/8, W/8] for our validated params."""
    with torch.no_grad():
        out = pipe(
            image=list(images) if images else None, prompt=params.prompt, height=params.height,
            width=params.width, num_inference_steps=params.num_inference_steps,
            guidance_scale=params.guidance_scale, generator=torch.Generator().manual_seed(params.seed),
            output_type="latent", **pipeline_call_kwargs(),
        ).images  # fmt: skip
    return out[0]


def test_an_adapter_on_the_modulation_fails_its_request_alone(tiny_folder, lora_dir, tmp_path):
    """The global modulations run per timestep outside the pack: an adapter updating one is refused
    when loaded, naming the module; a request with a good adapter in the same server goes on."""
    import shutil

    model_folder, _ = tiny_folder
    adapters_folder, _ = lora_dir
    shutil.copytree(adapters_folder, tmp_path / "loras")
    model = tiny_transformer()
    mixin = diffusers.loaders.Flux2LoraLoaderMixin
    save_peft_adapter(
        model, mixin, tmp_path / "loras", "mod", ["double_stream_modulation_img.linear"], seed=4
    )
    nodes = _nodes(model_folder, tmp_path / "loras")
    bad = _request("bad", [("mod", 1.0)], prompt="a cat", width=32, height=32, num_inference_steps=2, seed=1)
    good = _request("good", [("a", 0.5)], prompt="a dog", width=32, height=32, num_inference_steps=2, seed=2)
    nodes["text_encoder"].forward([bad, good])
    dit = nodes["dit"]
    for state in (bad, good):
        dit.prepare(state)
    with pytest.raises(RuntimeError, match="double_stream_modulation_img.linear"):
        dit.forward([bad])
    dit.release(bad)
    dit.forward([good])
    dit.release(good)
