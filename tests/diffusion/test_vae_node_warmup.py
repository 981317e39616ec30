"""The VAE node checks its compiled clip path at warmup, inline, on random latents (never on
zeros); single images take the plain path. A clip size decoded through `decode_uint8` at warmup would
compile in the background and swap in mid-traffic (first requests eager, with other bytes)."""

import pytest
import torch

from mstar.config import CompileSize
from mstar.diffusion.vae_decode import VaeDecodeRunner
from mstar.diffusion.vae_nodes import DecodeNode
from mstar.models.cosmos3.config import tiny_cosmos3_config
from mstar.models.cosmos3.pipeline import Cosmos3Pipeline
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.pipeline import WanPipeline


class RecordingRunner(VaeDecodeRunner):
    """The runner's own warm_decode over recorded decode and verify calls."""

    device = "cpu"
    dtype = torch.float32
    num_recompiles = 0

    def __init__(self):  # no decoder: only what warm_decode calls is recorded
        self.decoded, self.verified, self.finished = [], [], False

    def decode_uint8(self, latents, path="auto"):
        self.decoded.append(latents)

    def verify_fast_path(self, latents):
        self.verified.append(latents)
        return 99.0

    def finish_warmup(self):
        self.finished = True


def _wan(runner):
    return WanPipeline(tiny_wan22_config(), "cpu", torch.float32, decoder=runner), 16


def _cosmos3(runner):
    config = tiny_cosmos3_config()
    return Cosmos3Pipeline(config, "cpu", torch.float32, decoder=runner), config.vae.z_dim


@pytest.mark.parametrize("make", [_wan, _cosmos3], ids=["wan2.2", "cosmos3"])
def test_warmup_verifies_clip_shapes_on_random_latents(make):
    runner = RecordingRunner()
    pipeline, latent_channels = make(runner)
    sizes = [CompileSize(width=32, height=32, num_frames=9), CompileSize(width=32, height=32, num_frames=1)]
    node = DecodeNode(pipeline, warmup_sizes=sizes)
    node.warmup()
    # clips compiled and checked inline, before serving; images take the plain path
    assert [latents.shape[1:3] for latents in runner.verified] == [(latent_channels, 3)]
    assert [latents.shape[1:3] for latents in runner.decoded] == [(latent_channels, 1)]
    assert all(latents.abs().sum() > 0 for latents in runner.verified + runner.decoded)
    assert runner.finished
