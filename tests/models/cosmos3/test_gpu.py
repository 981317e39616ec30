"""Real-size Cosmos3 (Edge and Nano configs), seeded random bf16 weights, on the GPU: our
understanding prefill + packed generation pathway against diffusers' full forward, at Edge's
recipe size (832x480x121, 12090 vision tokens), text-to-video and image-to-video.

    python -m pytest -q -m gpu tests/models/cosmos3/test_gpu.py tests/engine/test_prefix_attention_gpu.py
"""

import gc

import pytest
import torch

from mstar.engine.attention import PrefixAttention, StackedPrefixKV, build_attention
from mstar.models.checkpoint import build_module
from mstar.models.cosmos3.config import EDGE_RECIPE, EDGE_TRANSFORMER, NANO_TRANSFORMER
from mstar.models.cosmos3.geometry import latent_shape
from mstar.models.cosmos3.transformer import Cosmos3Transformer, VisionInput
from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG
from tests.models.cosmos3.reference import diffusers_velocity

pytestmark = pytest.mark.gpu

MAX_RELATIVE_ERROR = 2e-2
PRESETS = {"edge": EDGE_TRANSFORMER, "nano": NANO_TRANSFORMER}
NUM_TEXT_TOKENS = (287, 141)  # a cond and an uncond prompt


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs.float()).norm() / theirs.float().norm())


@pytest.fixture(scope="module", params=list(PRESETS))
def models(request):
    """(ours, theirs) sharing one set of seeded random bf16 weights (time embedder in fp32)."""
    diffusers = pytest.importorskip("diffusers")
    config = PRESETS[request.param]
    ours = build_module(
        lambda: Cosmos3Transformer(config), "cuda", torch.bfloat16, seed=0,
        keep_fp32=Cosmos3Transformer.fp32_param_patterns,
    )  # fmt: skip
    kwargs = {**config.to_dict(), "action_dim": 64} if config.action_gen else config.to_dict()
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # diffusers' own init straight in bf16: half the memory
    try:
        with torch.device("cuda"):
            theirs = diffusers.Cosmos3OmniTransformer(**kwargs)
    finally:
        torch.set_default_dtype(default_dtype)
    # assign=True shares our tensors (and keeps the fp32 time embedder, as diffusers keeps it)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False, assign=True)
    assert not unexpected
    assert all(any(p in key for p in Cosmos3Transformer.unused_checkpoint_patterns) for key in missing)
    yield ours, theirs.eval().requires_grad_(False)
    del ours, theirs
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_real_size_generation_pathway_matches_diffusers_in_bf16(models, backend):
    ours, theirs = models
    config = ours.config
    generator = torch.Generator("cuda").manual_seed(0)
    shape = latent_shape(WAN22_TI2V_5B_VAE_CONFIG, EDGE_RECIPE.num_frames, EDGE_RECIPE.video_height,
                         EDGE_RECIPE.video_width)  # fmt: skip
    latents = torch.randn(shape, generator=generator, device="cuda")
    prompts = [
        torch.randint(0, config.vocab_size, (n,), generator=generator, device="cuda").tolist()
        for n in NUM_TEXT_TOKENS
    ]
    attention = build_attention(backend, "cuda", torch.bfloat16)
    dense = PrefixAttention(attention)
    with torch.inference_mode():
        prefixes = [ours.understand(ids, attention) for ids in prompts]
        for clean_frames, timestep in (((), 999.0), ((0,), 500.0)):
            items = [VisionInput(latents, timestep, EDGE_RECIPE.fps, clean_frames) for _ in prompts]
            packed = ours.generate(items, StackedPrefixKV(prefixes), dense)  # the guidance pair packed
            for out, ids in zip(packed, prompts, strict=True):
                expected = diffusers_velocity(theirs, ids, latents, timestep, EDGE_RECIPE.fps, clean_frames)
                assert out.shape == expected.shape
                error = _relative_error(out, expected)
                assert error <= MAX_RELATIVE_ERROR, (
                    f"relative error {error:.4f} ({attention.backend_name}, clean {clean_frames})"
                )


def test_edge_served_at_its_recipe_size_reuses_the_negative_prompt():
    """cosmos3-edge's nodes (random bf16 weights, eager) at 832x480x121, 2 steps: frames come out,
    the second prompt reuses the first's negative-prompt pages and no page stays held."""
    from mstar.bench.parity import run_ours
    from mstar.config import ServerConfig
    from mstar.graph import BuildContext
    from mstar.models.cosmos3.model import Cosmos3Spec

    spec = Cosmos3Spec()
    config = ServerConfig(device="cuda", compile_mode="off", warmup=False, random_weights=True)
    ctx = BuildContext(config=config, device="cuda", node_names=spec.node_names, random_weights=True)
    nodes = spec.build_nodes(ctx)
    fields = {"prompt": "a robot arm", "num_inference_steps": 2, "seed": 0}
    frames = run_ours(spec, nodes, fields)["frames"]
    run_ours(spec, nodes, {**fields, "prompt": "a dog"})
    assert tuple(frames.shape) == (121, 480, 832, 3)
    cache = nodes["dit"].pipeline.prefixes
    assert (cache.num_computed, cache.num_hits, cache.num_held) == (3, 1, 0)


def test_generation_stack_compiles_once_for_every_pack_on_cuda():
    """The tiny Cosmos3 as built_dit_node compiles it (deterministic, inductor, pack length dynamic):
    packs of other sizes, item counts, prefixes and clean frames run on the one compiled graph."""
    from mstar.engine.compile import compile_methods
    from mstar.models.cosmos3.config import tiny_cosmos3_config

    config = tiny_cosmos3_config().transformer
    ours = build_module(lambda: Cosmos3Transformer(config), "cuda", torch.bfloat16, seed=0,
                        keep_fp32=Cosmos3Transformer.fp32_param_patterns)  # fmt: skip
    parts = compile_methods(
        ours, Cosmos3Transformer.compiled_methods, "deterministic", "cosmos3.dit",
        persistent_rows=True, duck_shapes=False,
    )  # fmt: skip
    attention = build_attention("torch", "cuda", torch.bfloat16)
    dense = PrefixAttention(attention)
    generator = torch.Generator().manual_seed(0)

    def item(frames, height, width, clean=()):
        latents = torch.randn(16, frames, height, width, generator=generator).cuda()
        return VisionInput(latents, 700.0, 24.0, clean)

    def prompt(length):
        return torch.randint(0, 256, (length,), generator=generator).tolist()

    packs = [
        [item(2, 8, 8)],
        [item(2, 8, 8)] * 2,
        [item(3, 8, 12), item(1, 12, 8), item(2, 8, 8, clean=(0,))],
        [item(2, 16, 8)] * 4,
    ]
    with torch.inference_mode():
        for index, pack in enumerate(packs):
            prefixes = [ours.understand(prompt(9 + 5 * i + index), attention) for i in range(len(pack))]
            ours.generate(pack, StackedPrefixKV(prefixes), dense)
    assert [part.num_compiles for part in parts.parts] == [1]
