"""Real-size Wan2.2-TI2V-5B with seeded random weights through our nodes on the GPU (smoke + batching)."""

import pytest
import torch

from mstar.config import ServerConfig
from mstar.engine.kernels import triton_kernels_usable
from mstar.graph import BuildContext, GenerationParams, Loop, RequestState
from mstar.models.wan22.model import Wan22Spec


def _run_stage(node, batch):
    for request in batch:
        node.prepare(request)
    active = list(batch)
    while active:
        node.forward(active)
        active = [r for r in active if not node.check_stop(r)]
    for request in batch:
        node.release(request)


@pytest.mark.gpu
@pytest.mark.slow
def test_random_weights_text_to_video_on_gpu():
    spec = Wan22Spec()
    server = ServerConfig(device="cuda", compile_mode="off", warmup=False)
    names = ("text_encoder", "dit", "vae_decoder")
    nodes = spec.build_nodes(
        BuildContext(config=server, device="cuda", node_names=names, random_weights=True)
    )
    fields = [
        {"prompt": "a fox in the snow", "width": 832, "height": 480, "num_frames": 33, "num_inference_steps": 2},
        {"prompt": "a ship", "width": 480, "height": 832, "num_frames": 17, "num_inference_steps": 3,
         "guidance_scale": 1.0},
    ]  # fmt: skip
    requests = [
        RequestState(f"r{i}", spec.validate(GenerationParams(**f, seed=i))) for i, f in enumerate(fields)
    ]
    dit = nodes["dit"].pipeline.dit
    from mstar.models.wan22.optimize import FusedSelfAttention, KernelBlocks, KernelSelfAttention

    assert isinstance(dit.blocks[0].attn1, FusedSelfAttention)  # ServerConfig.fuse_projections: on for CUDA
    # ServerConfig.triton_kernels: on where Triton is installed, so this runs the kernels eagerly
    kernels = triton_kernels_usable("cuda")
    assert isinstance(dit.blocks, KernelBlocks) == kernels
    assert isinstance(dit.blocks[0].attn1, KernelSelfAttention) == kernels
    _run_stage(nodes["text_encoder"], requests)
    for stage in spec.walks["t2v"].stages:
        _run_stage(nodes[stage.node if isinstance(stage, Loop) else stage], requests)
    for request in requests:
        p = request.params
        frames = request.tensors["frames"]
        assert frames.dtype == torch.uint8 and frames.shape == (p.num_frames, p.height, p.width, 3)
