"""The VAE node checks its compiled clip path at warmup on random latents, never on zeros."""

import torch

from mstar.config import CompileSize
from mstar.diffusion.vae_nodes import DecodeNode
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.pipeline import WanPipeline


class RecordingRunner:
    device = "cpu"
    dtype = torch.float32
    num_recompiles = 0

    def __init__(self):
        self.decoded, self.verified, self.finished = [], [], False

    def decode_uint8(self, latents):
        self.decoded.append(latents)

    def verify_fast_path(self, latents):
        self.verified.append(latents)
        return 99.0

    def finish_warmup(self):
        self.finished = True


def test_warmup_verifies_clip_shapes_on_random_latents():
    runner = RecordingRunner()
    sizes = [CompileSize(width=32, height=32, num_frames=9), CompileSize(width=32, height=32, num_frames=1)]
    node = DecodeNode(
        WanPipeline(tiny_wan22_config(), "cpu", torch.float32, decoder=runner), warmup_sizes=sizes
    )
    node.warmup()
    # clips compiled and checked inline, before serving; images take the plain path
    assert [tuple(latents.shape) for latents in runner.verified] == [(1, 16, 3, 4, 4)]
    assert [tuple(latents.shape) for latents in runner.decoded] == [(1, 16, 1, 4, 4)]
    assert all(latents.abs().sum() > 0 for latents in runner.verified + runner.decoded)
    assert runner.finished
