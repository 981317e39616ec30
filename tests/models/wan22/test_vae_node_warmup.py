"""The VAE node checks its compiled clip path at warmup on random latents, never on zeros."""

import torch

from mstar.models.wan22.nodes import WanVAEDecodeNode


class RecordingRunner:
    device = "cpu"
    dtype = torch.float32
    num_recompiles = 0

    def __init__(self):
        self.decoded, self.verified, self.finished = [], [], False

    def decode_uint8(self, latents):
        self.decoded.append(latents)

    def verify_fast_path(self, latents):
        self.verified.append(tuple(latents.shape))
        return 99.0

    def finish_warmup(self):
        self.finished = True


def test_warmup_verifies_clip_shapes_on_random_latents():
    runner = RecordingRunner()
    node = WanVAEDecodeNode(runner, config=None, warmup_shapes=[(4, 3, 2, 2), (4, 1, 2, 2)])
    node.warmup()
    assert runner.verified == [(1, 4, 3, 2, 2)]  # compiled and checked inline, before serving
    assert [tuple(latents.shape) for latents in runner.decoded] == [(1, 4, 1, 2, 2)]  # images: plain
    assert all(latents.abs().sum() > 0 for latents in runner.decoded)
    assert runner.finished
