"""Real-size klein on a GPU (the lead runs these on an H200): a folder written by
Flux2KleinPipeline.save_pretrained with random weights served with --model-path (our loaders read
it), a text-to-image request and an edit with two references packed in every step, against the
pipeline on the same folder; the compiled DiT does not recompile after its boot warmup."""

import numpy as np
import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState, reference_image_input
from mstar.models.flux2_klein.config import KLEIN_4B
from mstar.models.flux2_klein.model import Flux2KleinSpec
from tests.models.flux2_klein.test_serving import generate

pytestmark = pytest.mark.gpu
MAX_REL_ERR = 2e-2


def make_request(spec, request_id, images=(), **fields):
    sizes = tuple((image.shape[1], image.shape[0]) for image in images)
    request = RequestState(request_id, spec.validate(GenerationParams(reference_sizes=sizes, **fields)))
    for index, image in enumerate(images):
        request.tensors[reference_image_input(index)] = image
    return request


@pytest.fixture(scope="module")
def real_folder(tmp_path_factory):
    from mstar.models.flux2_klein.parity import load_pipeline, write_folder

    folder = tmp_path_factory.mktemp("flux2-klein-4b-real")
    write_folder(KLEIN_4B, folder, "cuda", seed=0)
    return folder, load_pipeline(folder, "cuda")


def test_real_size_folder_served_with_model_path(real_folder):
    folder, pipe = real_folder
    spec = Flux2KleinSpec()
    config = ServerConfig(
        model=spec.name, device="cuda", model_path=str(folder), compile_mode="off", warmup=False
    )
    ctx = BuildContext(config=config, device="cuda", node_names=spec.node_names, model_path=str(folder))
    nodes = spec.build_nodes(ctx)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((512, 384), (384, 512))]
    t2i = make_request(
        spec, "t2i", prompt="a lighthouse", width=512, height=512, num_inference_steps=2, seed=1
    )
    edit = make_request(spec, "edit", images, prompt="blue", num_inference_steps=2, seed=2)
    latents = generate(nodes, [t2i, edit])
    assert t2i.tensors["frames"].shape == (1, 512, 512, 3) and edit.tensors["frames"].shape == (
        1,
        512,
        384,
        3,
    )

    from PIL import Image

    from mstar.models.flux2_klein.parity import run_pipeline

    for request, ours, refs in (
        (t2i, latents[0], None),
        (edit, latents[1], [Image.fromarray(i) for i in images]),
    ):
        p = request.params
        fields = {"prompt": p.prompt, "width": p.width, "height": p.height, "seed": p.seed,
                  "num_inference_steps": p.num_inference_steps, "guidance_scale": p.guidance_scale}  # fmt: skip
        with torch.inference_mode():
            if refs is None:
                theirs = run_pipeline(pipe, fields, "latent", KLEIN_4B)
            else:
                theirs = _edit_latents(pipe, fields, refs)
        rel = ((ours.float().cpu() - theirs.float().cpu()).norm() / theirs.float().cpu().norm()).item()
        assert rel <= MAX_REL_ERR, (request.request_id, rel)


def _edit_latents(pipe, fields, images):
    from mstar.bench.parity_families import seeded_generator
    from mstar.models.flux2_klein.parity import transformer_grid

    out = pipe(
        image=images, prompt=fields["prompt"], num_inference_steps=fields["num_inference_steps"],
        guidance_scale=fields["guidance_scale"], generator=seeded_generator(fields), output_type="latent",
    ).images  # fmt: skip
    return transformer_grid(pipe, out)


@pytest.mark.slow
def test_compiled_dit_does_not_recompile_across_sizes_and_references():
    spec = Flux2KleinSpec()
    config = ServerConfig(
        model=spec.name, device="cuda", random_weights=True, compile_mode="deterministic",
        warmup=True, compile_sizes=["512x512"],
    )  # fmt: skip
    ctx = BuildContext(config=config, device="cuda", node_names=spec.node_names, random_weights=True)
    nodes = spec.build_nodes(ctx)
    for node in nodes.values():
        node.warmup()
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (384, 512, 3), dtype=np.uint8)
    requests = [
        make_request(spec, "a", prompt="a", width=512, height=512, num_inference_steps=2, seed=1),
        make_request(spec, "b", prompt="b", width=768, height=512, num_inference_steps=2, seed=2),
        make_request(spec, "c", [image], prompt="c", num_inference_steps=2, seed=3),
    ]
    generate(nodes, requests)
    generate(nodes, requests[:1])
    assert nodes["dit"].num_recompiles() == 0


@pytest.mark.parametrize(
    ("kernels", "compile_mode"),
    [(False, "off"), (True, "off"), (True, "deterministic")],
    ids=["fused", "kernels", "kernels-compiled"],
)
def test_optimized_real_size_dit_matches_eager_on_a_mixed_pack(kernels, compile_mode):
    """optimize() at klein 4B's real size in bf16 on the GPU (fused projections, then the Triton
    kernels, eagerly and launched from the compiled graph): a 1024x1024 text-to-image item and a
    768x512 edit with two references in one pack, against the eager model on the same weights."""
    import copy

    from mstar.engine.attention import build_attention
    from mstar.engine.compile import compile_methods
    from mstar.models.flux2_klein.dit import DiTInput, Flux2DiT
    from mstar.models.flux2_klein.optimize import optimize
    from mstar.models.flux2_klein.weights import build_dit

    config = KLEIN_4B.transformer
    eager = build_dit(config, "cuda", torch.bfloat16, seed=0)
    fused = optimize(copy.deepcopy(eager), fuse=True, kernels=kernels)
    if compile_mode != "off":
        compile_methods(
            fused,
            Flux2DiT.compiled_methods,
            compile_mode,
            "flux2.dit",
            persistent_rows=True,
            duck_shapes=False,
        )
    generator = torch.Generator("cuda").manual_seed(0)

    def grid(rows, cols):
        return torch.randn(config.in_channels, rows, cols, generator=generator, device="cuda").bfloat16()

    def text():
        shape = (KLEIN_4B.max_sequence_length, config.joint_attention_dim)
        return torch.randn(shape, generator=generator, device="cuda").bfloat16()

    items = [
        DiTInput(grid(64, 64), 980.0, text()),
        DiTInput(grid(32, 48), 500.0, text(), [grid(32, 32), grid(24, 40)]),
    ]
    attention = build_attention("auto", "cuda", torch.bfloat16)
    with torch.inference_mode():
        want, got = eager(items, attention), fused(items, attention)
    for a, b in zip(want, got, strict=True):
        rel = ((b.float() - a.float()).norm() / a.float().norm()).item()
        assert rel <= MAX_REL_ERR, rel


@pytest.mark.slow
def test_after_warmup_a_first_generation_and_edit_at_the_configured_size_compile_nothing():
    """Real size, compiled as served: after every node's boot warmup at 512x512, a text-to-image
    request and an edit with two 512x512 references run on graphs compiled at warmup only (the
    VAE's encode and decode sizes among the checked ones, none left for the compile thread)."""
    from mstar.engine.checked_compile import COMPILED, PENDING

    spec = Flux2KleinSpec()
    config = ServerConfig(
        model=spec.name, device="cuda", random_weights=True, compile_mode="deterministic",
        warmup=True, compile_sizes=["512x512"],
    )  # fmt: skip
    ctx = BuildContext(config=config, device="cuda", node_names=spec.node_names, random_weights=True)
    nodes = spec.build_nodes(ctx)
    for node in nodes.values():
        node.warmup()
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, (512, 512, 3), dtype=np.uint8) for _ in range(2)]
    generate(
        nodes, [make_request(spec, "t2i", prompt="a", width=512, height=512, num_inference_steps=2, seed=1)]
    )
    generate(nodes, [make_request(spec, "edit", images, prompt="b", num_inference_steps=2, seed=2)])
    assert [node.num_recompiles() for node in nodes.values()] == [0, 0, 0, 0]
    encode = nodes["vae_encoder"].pipeline.encoder.checked
    decode = nodes["vae_decoder"].pipeline.decoder.checked
    assert encode.keys(COMPILED) == {(1, 3, 512, 512)} and decode.keys(COMPILED) == {(32, 32)}
    assert not encode.keys(PENDING) and not decode.keys(PENDING)
