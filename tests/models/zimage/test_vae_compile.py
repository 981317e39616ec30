"""The VAE node's compiled decode: warmed per size, checked against eager, eager on a mismatch, a
new size served eagerly while it compiles off the serving path (CPU, tiny config; the real compile
runs in test_gpu_vae.py)."""

import threading

import pytest
import torch
import torch.nn.functional as F

from mstar.config import CompileSize
from mstar.diffusion.vae_nodes import FRAMES, LATENTS, DecodeNode
from mstar.engine.checked_compile import COMPILED, EAGER, PENDING, BackgroundCompiler, off_serving_path
from mstar.graph import RequestState
from mstar.models.zimage.config import TINY
from mstar.models.zimage.nodes import checked_decode
from mstar.models.zimage.pipeline import ZImagePipeline
from mstar.models.zimage.vae import GroupNorm, group_norm_by_pixel_blocks
from mstar.models.zimage.weights import build_vae_decoder

HANG_GUARD_S = 60.0
WARM_SIZE = (32, 32)  # (width, height) -> latents [16, 16, 16] with the tiny 2x VAE


def decode_node(vae, compile_mode: str, warmup_sizes=(), compiler=None) -> DecodeNode:
    """The Z-Image decode node as nodes.py builds it; `node.decode` is its checked decode (its
    background compiles on `compiler`, the process's compile thread by default)."""
    decoder = checked_decode(vae, compile_mode, compiler=compiler)
    pipeline = ZImagePipeline(TINY, "cpu", vae=vae, decoder=decoder)
    node = DecodeNode(pipeline, warmup_sizes=[CompileSize(width=w, height=h) for w, h in warmup_sizes])
    node.decode = pipeline.decoder
    return node


@pytest.fixture
def vae():  # one per test: a compiled node switches its norms to pixel blocks for good
    return build_vae_decoder(TINY.vae, "cpu", torch.float32)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # compiled graphs of other tests guard on other modules
    yield
    torch._dynamo.reset()


class FakeCompiled:
    """Stands in for the compiled decode: the eager frames, optionally corrupted; counts calls."""

    num_recompiles = 0

    def __init__(self, vae, corrupt: bool):
        self.vae, self.corrupt, self.num_calls = vae, corrupt, 0

    def __call__(self, latents):
        self.num_calls += 1
        frames = self.vae.decode_frames(latents)
        return 255 - frames if self.corrupt else frames

    def finish_warmup(self):
        pass


def latents_for(width: int, height: int, seed: int = 5) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(TINY.vae.latent_channels, height // 2, width // 2, generator=generator)


def decode_request(node: DecodeNode, latents: torch.Tensor) -> torch.Tensor:
    request = RequestState("r", None)
    request.tensors[LATENTS] = latents
    node.forward([request])
    assert LATENTS not in request.tensors
    return request.tensors[FRAMES]


def test_eager_path_is_the_plain_decode(vae):
    node = decode_node(vae, "off", warmup_sizes=[WARM_SIZE])
    node.warmup()
    latents = latents_for(24, 16)
    frames = decode_request(node, latents)
    assert frames.dtype == torch.uint8 and frames.shape == (1, 16, 24, 3)
    with torch.inference_mode():
        assert torch.equal(frames, vae.decode_frames(latents))
    assert node.decode is None and node.num_recompiles() == 0


def test_corrupted_compiled_frames_fall_back_to_eager_for_that_size(vae):
    node = decode_node(vae, "default", warmup_sizes=[WARM_SIZE])
    fake = node.decode.compiled = FakeCompiled(vae, corrupt=True)
    node.warmup()
    assert fake.num_calls == 1
    assert node.decode.checked.keys(EAGER) == {(16, 16)}
    assert node.decode.checked.psnr_db[(16, 16)] < 40.0
    latents = latents_for(*WARM_SIZE)
    frames = decode_request(node, latents)
    assert fake.num_calls == 1  # the size decodes eagerly now, never through the fake
    with torch.inference_mode():
        assert torch.equal(frames, vae.decode_frames(latents))


def test_a_new_size_is_served_eagerly_and_checked_off_the_serving_path(vae):
    compiler = BackgroundCompiler()
    node = decode_node(vae, "default", warmup_sizes=[WARM_SIZE], compiler=compiler)
    node.decode.compiled = FakeCompiled(vae, corrupt=False)
    node.warmup()
    assert node.decode.checked.psnr_db == {(16, 16): float("inf")} and not node.decode.checked.keys(EAGER)
    node.decode.compiled = fake = FakeCompiled(vae, corrupt=True)  # a miscompile at a size not warmed
    latents = latents_for(24, 16)
    frames = decode_request(node, latents)
    with torch.inference_mode():
        assert torch.equal(frames, vae.decode_frames(latents))
    assert compiler.wait_idle(HANG_GUARD_S)
    assert fake.num_calls == 1 and node.decode.checked.keys(EAGER) == {(8, 12)}  # checked once, off the path
    assert torch.equal(decode_request(node, latents), frames)  # and never served
    assert fake.num_calls == 1


class GatedCompile:
    """compile_fx replaced by the traced graph run eagerly (inductor's C++ build is slow); a compile
    on the compile thread waits for `gate`."""

    def __init__(self):
        self.gate, self.blocked = threading.Event(), threading.Event()

    def __call__(self, graph, inputs, config_patches=None):
        if off_serving_path():
            self.blocked.set()
            assert self.gate.wait(HANG_GUARD_S)
        return graph.forward


def test_a_new_size_waits_for_no_compile_and_is_swapped_in_after(vae, monkeypatch):
    gated = GatedCompile()
    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx", gated)
    compiler = BackgroundCompiler()
    node = decode_node(vae, "default", warmup_sizes=[WARM_SIZE], compiler=compiler)
    node.warmup()
    (compiled,) = node.decode.parts
    assert compiled.num_compiles == 1 and node.num_recompiles() == 0
    assert node.decode.checked.psnr_db[(16, 16)] >= 40.0
    decode_request(node, latents_for(*WARM_SIZE).to(torch.bfloat16))  # cast to float32: same graph
    assert node.num_recompiles() == 0
    latents = latents_for(24, 16)
    frames = decode_request(node, latents)  # done while its size's compile is blocked
    assert gated.blocked.wait(HANG_GUARD_S) and node.decode.checked.state((8, 12)) == PENDING
    gated.gate.set()
    assert compiler.wait_idle(HANG_GUARD_S)
    assert node.decode.checked.state((8, 12)) == COMPILED and node.decode.checked.psnr_db[(8, 12)] >= 40.0
    assert torch.equal(decode_request(node, latents), frames)  # now compiled: same frames here
    assert (compiled.num_compiles, compiled.num_background_compiles, node.num_recompiles()) == (1, 1, 0)
    assert node.decode.num_background_compiles == 1


def test_latents_reach_the_compiled_decode_as_contiguous_inference_tensors():
    from mstar.models.zimage.nodes import as_inference_tensor

    normal = torch.randn(16, 8, 6)
    converted = as_inference_tensor(normal)
    assert converted.is_inference() and torch.equal(converted, normal)
    transposed = as_inference_tensor(torch.randn(16, 6, 8).transpose(1, 2))
    assert transposed.is_inference() and transposed.is_contiguous()
    with torch.inference_mode():
        already = torch.randn(16, 8, 6)
    assert as_inference_tensor(already) is already  # no copy when it is one already


def test_a_normal_tensor_after_an_inference_one_would_recompile_without_the_conversion():
    from torch._dynamo.testing import CompileCounter

    from mstar.models.zimage.nodes import as_inference_tensor

    def run(convert: bool) -> int:
        counter = CompileCounter()
        decode = torch.compile(lambda x: x * 2 + 1, backend=counter, dynamic=False)
        with torch.inference_mode():
            decode(torch.randn(4, 3))  # warmup: made in inference mode
        request = torch.randn(4, 3)  # the loop's final latents: a normal tensor
        with torch.inference_mode():
            decode(as_inference_tensor(request) if convert else request)
        return counter.frame_count

    torch._dynamo.reset()
    assert run(convert=False) == 2  # the mechanism seen on the H200
    torch._dynamo.reset()
    assert run(convert=True) == 1


@pytest.mark.parametrize(
    "shape, channels_last",
    [((1, 64, 32, 48), True), ((1, 64, 32, 48), False), ((2, 32, 6, 10), True), ((1, 64, 7, 9), True),
     ((1, 128, 300), False)],
)  # fmt: skip
def test_group_norm_by_pixel_blocks_equals_group_norm(shape, channels_last):
    """Every layout and pixel count (7x9: blocks of one pixel); values far from zero mean, so a
    variance taken as E[x^2] - E[x]^2 would lose digits the combination here keeps."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64) * 3 + 40
    weight, bias = torch.randn(shape[1], dtype=torch.float64), torch.randn(shape[1], dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    got = group_norm_by_pixel_blocks(x.float(), 16, weight.float(), bias.float(), 1e-6)
    expected = F.group_norm(x, 16, weight, bias, 1e-6)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-5)


def test_compiled_node_takes_norm_statistics_by_pixel_blocks_and_eager_keeps_group_norm(vae):
    norms = [module for module in vae.modules() if isinstance(module, GroupNorm)]
    assert norms and not any(norm.by_pixel_blocks for norm in norms)
    latents = latents_for(24, 16)
    with torch.inference_mode():
        plain = vae.decode(latents.unsqueeze(0))
    decode_node(vae, "off", warmup_sizes=[WARM_SIZE])
    assert not any(norm.by_pixel_blocks for norm in norms)
    decode_node(vae, "default", warmup_sizes=[WARM_SIZE])
    assert all(norm.by_pixel_blocks for norm in norms)
    with torch.inference_mode():
        by_blocks = vae.decode(latents.unsqueeze(0))
    torch.testing.assert_close(by_blocks, plain, rtol=0, atol=1e-5)
