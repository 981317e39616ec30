"""A clip at a resolution the warmup did not compile is decoded at once on the eager step while its
graphs compile off the serving path; once they are checked, later clips decode compiled."""

from __future__ import annotations

import copy
import threading

import torch

from mstar.diffusion.vae_decode import VaeDecodeRunner
from mstar.engine.checked_compile import COMPILED, PENDING, BackgroundCompiler, off_serving_path
from tests.models.wan22.test_vae_compile import decoder_bf16  # noqa: F401 (fixture)

HANG_GUARD_S = 120.0


class GatedBackend:
    """Runs each graph as traced (bit-exact with eager); compiles on the compile thread wait for
    `gate`, and every graph it built counts its runs."""

    def __init__(self):
        self.gate, self.blocked = threading.Event(), threading.Event()
        self.num_graphs, self.num_compiled_runs = 0, 0

    def __call__(self, graph_module, example_inputs):
        if off_serving_path():
            self.blocked.set()
            assert self.gate.wait(HANG_GUARD_S)
        self.num_graphs += 1

        def run(*args):
            self.num_compiled_runs += 1
            return graph_module.forward(*args)

        return run


def _latents(height: int, width: int, num_frames: int = 3, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, num_frames, height, width, generator=generator).to(torch.bfloat16)


def test_an_unwarmed_resolution_is_served_while_its_compile_waits(decoder_bf16):  # noqa: F811
    backend, compiler = GatedBackend(), BackgroundCompiler()
    runner = VaeDecodeRunner(copy.deepcopy(decoder_bf16), compile_backend=backend, compiler=compiler)
    eager = VaeDecodeRunner(copy.deepcopy(decoder_bf16))
    torch._dynamo.reset()
    assert runner.verify_fast_path(_latents(2, 3)) >= 40.0  # warmup: compiled inline
    runner.finish_warmup()
    assert backend.num_graphs == 2  # first chunk, steady chunk

    clip = _latents(3, 2, num_frames=4)  # a resolution nobody listed
    key = runner.shape_key(clip)
    frames = runner.decode_uint8(clip)  # returns with the compile of its graphs still blocked
    assert backend.blocked.wait(HANG_GUARD_S) and runner.checked.state(key) == PENDING
    assert torch.equal(frames, eager.decode_uint8(clip))
    with torch.inference_mode():
        pieces = list(runner.iter_host_uint8(clip))  # the streamed path too
    assert torch.equal(torch.cat(pieces), frames)

    backend.gate.set()
    assert compiler.wait_idle(HANG_GUARD_S)
    assert runner.checked.state(key) == COMPILED and runner.checked.psnr_db[key] >= 40.0
    runs_before = backend.num_compiled_runs
    assert torch.equal(runner.decode_uint8(clip), frames)  # swapped in: same frames
    assert backend.num_compiled_runs - runs_before == 4  # every chunk ran compiled
    assert backend.num_graphs == 4 and runner.num_recompiles == 0
    assert runner.num_background_compiles == 2
    torch._dynamo.reset()
