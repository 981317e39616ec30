"""Real-size Z-Image-Turbo on a GPU with seeded random weights (the lead runs these on an H200)."""

import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, RequestState
from mstar.models.zimage.config import REAL
from mstar.models.zimage.model import ZImageSpec

pytestmark = pytest.mark.gpu


def run_requests(nodes, requests):
    nodes["text_encoder"].forward(requests)
    dit = nodes["dit"]
    for request in requests:
        dit.prepare(request)
    running = list(requests)
    while running:
        dit.forward(running)
        running = [r for r in running if not dit.check_stop(r)]
    nodes["vae_decoder"].forward(requests)


def real_nodes(compile_mode: str, warmup: bool, compile_sizes=()):
    spec = ZImageSpec()
    config = ServerConfig(
        model="z-image-turbo", device="cuda", random_weights=True, compile_mode=compile_mode,
        warmup=warmup, compile_sizes=list(compile_sizes),
    )  # fmt: skip
    ctx = BuildContext(config=config, device="cuda", node_names=spec.node_names, random_weights=True)
    nodes = spec.build_nodes(ctx)
    if warmup:
        for node in nodes.values():
            node.warmup()
    return spec, nodes


def make_request(spec, request_id, **fields):
    from mstar.graph import GenerationParams

    return RequestState(request_id, spec.validate(GenerationParams(**fields)))


def test_real_size_random_weights_generate_packed_requests():
    from mstar.engine.kernels import triton_kernels_usable

    spec, nodes = real_nodes("off", warmup=False)
    dit = nodes["dit"].pipeline.dit
    from mstar.models.zimage.optimize import FusedSelfAttention, KernelModulatedBlocks, KernelSelfAttention

    assert isinstance(
        dit.layers[0].attention, FusedSelfAttention
    )  # ServerConfig.fuse_projections: on for CUDA
    # ServerConfig.triton_kernels: on where Triton is installed, so this runs the kernels eagerly
    kernels = triton_kernels_usable("cuda")
    assert isinstance(dit.layers, KernelModulatedBlocks) == kernels
    assert isinstance(dit.layers[0].attention, KernelSelfAttention) == kernels
    plain = make_request(
        spec, "a", prompt="a lighthouse at dusk", width=512, height=512, num_inference_steps=2, seed=1
    )
    guided = make_request(
        spec, "b", prompt="a cat", negative_prompt="blurry", width=768, height=512,
        num_inference_steps=3, guidance_scale=2.0, seed=2,
    )  # fmt: skip
    run_requests(nodes, [plain, guided])
    for state, (height, width) in ((plain, (512, 512)), (guided, (512, 768))):
        frames = state.tensors["frames"]
        assert frames.dtype == torch.uint8 and frames.shape == (1, height, width, 3)
        assert frames.device.type == "cuda"
    assert nodes["dit"].progress(guided) == (3, 3)


@pytest.mark.slow
def test_compiled_layer_stack_does_not_recompile_across_sizes():
    spec, nodes = real_nodes("deterministic", warmup=True, compile_sizes=["512x512"])
    requests = [
        make_request(spec, "a", prompt="short", width=512, height=512, num_inference_steps=2, seed=1),
        make_request(
            spec, "b", prompt="a longer prompt " * 8, width=640, height=384, num_inference_steps=2, seed=2
        ),
    ]
    run_requests(nodes, requests)
    assert nodes["dit"].num_recompiles() == 0


def test_real_size_vae_decode_bf16_matches_diffusers():
    diffusers = pytest.importorskip("diffusers")
    from mstar.models.zimage.config import to_json_dict
    from mstar.models.zimage.vae import VAEDecoder

    vae_config = to_json_dict(REAL.vae)
    num_blocks = len(REAL.vae.block_out_channels)
    torch.manual_seed(0)
    with torch.device("cuda"):
        reference = diffusers.AutoencoderKL(
            down_block_types=["DownEncoderBlock2D"] * num_blocks,
            up_block_types=["UpDecoderBlock2D"] * num_blocks,
            use_quant_conv=False,
            **vae_config,
        )
    reference = reference.to(torch.bfloat16).eval()
    with torch.device("meta"):
        ours = VAEDecoder(REAL.vae)
    decoder_state = {k: v for k, v in reference.state_dict().items() if k.startswith("decoder.")}
    ours.load_state_dict(decoder_state, strict=True, assign=True)
    latents = torch.randn(1, 16, 128, 128, device="cuda")
    with torch.no_grad():
        expected = reference.decode((latents / 0.3611 + 0.1159).to(torch.bfloat16)).sample.float()
        got = ours.eval().decode(latents).float()
    assert ((got - expected).norm() / expected.norm()).item() <= 2e-2
