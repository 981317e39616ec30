"""The compiled VAE fast decode computes what eager does (bf16, channels_last_3d, real AOT tracing).

torch.compile traces with fake tensors; a program whose layout choices depend on strides that
fake and real tensors disagree on (strides of size-1 dims steer suggest_memory_format, hence a
conv's output memory format) silently computes garbage once compiled. backend="eager" skips that
tracing, so these tests use "aot_eager" (functionalised ATen graph, eager kernels, bit-exact) and,
in the slow tier, inductor with our "deterministic" options.
"""

import copy

import pytest
import torch

import mstar.engine.compile as engine_compile
from mstar.diffusion.vae_decode import VaeDecodeRunner, convert_to_channels_last
from mstar.engine.checked_compile import COMPILED, EAGER, uint8_psnr_db
from mstar.models.wan22.vae import WanVAEDecoder
from mstar.models.wan22.vae_blocks import AttentionBlock, ResidualBlock, pin_frame_layout
from mstar.models.wan22.vae_coders import ResidualUpBlock
from tests.models.wan22.test_vae_decode import TINY_WAN22


@pytest.fixture(scope="module")
def decoder_bf16():
    torch.manual_seed(0)
    module = WanVAEDecoder(TINY_WAN22).eval().requires_grad_(False)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.5, 1.5)
    return module.to(torch.bfloat16)


@pytest.fixture(scope="module")
def clip_latents():
    return torch.randn(1, 4, 4, 2, 3, generator=torch.Generator().manual_seed(2))  # 13 frames, 32x48


def test_attention_block_compiled_equals_eager_bf16_channels_last():
    """One chunk's frame (T = 1) in channels_last_3d: the case whose fake strides differ."""
    torch.manual_seed(0)
    block = AttentionBlock(32)
    with torch.no_grad():
        block.norm.gamma.uniform_(0.5, 1.5)
    block = convert_to_channels_last(block.to(torch.bfloat16).eval())
    x = torch.randn(1, 32, 1, 6, 10, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    torch._dynamo.reset()
    with torch.inference_mode():
        expected = block(x)
        compiled = torch.compile(block, backend="aot_eager", dynamic=False)(x)
    assert torch.equal(compiled, expected)


def test_attention_block_is_the_conv_formulation():
    """The matmul form equals diffusers' 1x1-conv form (fp32, plain layout)."""
    torch.manual_seed(0)
    block = AttentionBlock(16).eval()
    with torch.no_grad():
        block.norm.gamma.uniform_(0.5, 1.5)
    x = torch.randn(2, 16, 3, 4, 5)
    with torch.no_grad():
        b, c, t, h, w = x.shape
        frames = block.norm(x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w))
        q, k, v = block.to_qkv(frames).flatten(2).transpose(1, 2).unsqueeze(1).chunk(3, dim=-1)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v).squeeze(1)
        projected = block.proj(attended.transpose(1, 2).reshape(b * t, c, h, w))
        expected = projected.reshape(b, t, c, h, w).permute(0, 2, 1, 3, 4) + x
        assert torch.allclose(block(x), expected, atol=1e-5, rtol=1e-5)


def test_fast_path_aot_eager_bf16_channels_last_equals_eager(decoder_bf16, clip_latents):
    """Chunks of 1 then 2 then 1 latent frames: three compiled graphs, each bit-equal to eager."""
    eager = VaeDecodeRunner(copy.deepcopy(decoder_bf16), channels_last=True, chunk_latent_frames=2)
    compiled = VaeDecodeRunner(
        copy.deepcopy(decoder_bf16), channels_last=True, chunk_latent_frames=2, compile_backend="aot_eager"
    )
    torch._dynamo.reset()
    expected = eager.decode_fast_uint8(clip_latents)
    assert expected.shape == (13, 32, 48, 3)
    assert torch.equal(compiled.decode_fast_uint8(clip_latents), expected)
    assert torch.equal(compiled.decode_fast_uint8(clip_latents), expected)  # steady state, cached graphs


@pytest.mark.slow
def test_fast_path_inductor_deterministic_bf16_matches_eager(decoder_bf16, clip_latents, monkeypatch):
    """Our CompiledFunction with the "deterministic" inductor options, forced on CPU (~1-2 min).

    Inductor computes in fp32 between bf16 stores, so frames may differ by a few levels, not more.
    """
    monkeypatch.setattr(engine_compile, "effective_mode", lambda mode, device: mode)
    eager = VaeDecodeRunner(copy.deepcopy(decoder_bf16), channels_last=True)
    compiled = VaeDecodeRunner(copy.deepcopy(decoder_bf16), compile_mode="deterministic", channels_last=True)
    assert compiled.compile_mode == "deterministic"
    torch._dynamo.reset()
    expected = eager.decode_fast_uint8(clip_latents).int()
    for _ in range(2):
        frames = compiled.decode_fast_uint8(clip_latents).int()
        assert (frames - expected).abs().max() <= 8
        assert (frames - expected).abs().float().mean() < 1.0


def test_vae_steps_compile_without_comprehensive_padding(decoder_bf16, monkeypatch):
    """torch 2.11's comprehensive padding miscompiles Conv3d decoders (see VAE_INDUCTOR_OPTIONS)."""
    monkeypatch.setattr(engine_compile, "effective_mode", lambda mode, device: mode)
    runner = VaeDecodeRunner(copy.deepcopy(decoder_bf16), compile_mode="deterministic")
    for step in (runner._uint8_step, runner._video_step):
        assert isinstance(step, engine_compile.CompiledFunction)
        assert step.extra_options["comprehensive_padding"] is False


def test_compiled_function_extra_options_reach_inductor(monkeypatch):
    """A misaligned 1320-element stride is padded by default (CPU padding switched on) and not with the patch."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    monkeypatch.setattr(inductor_config, "disable_padding_cpu", False)
    # a cached compile skips lowering, hence the padding count
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(functorch_config, "enable_autograd_cache", False)

    def many_reductions(x):
        y = torch.sin(x) * torch.cos(x) + torch.exp(x)  # realised: read by six reductions
        return y.sum(0), y.sum(1), y.mean(2), y.amax(2), y.amin(1), y.prod(0)

    x = torch.randn(16, 40, 33)
    num_paddings = []
    for extra_options in ({}, {"comprehensive_padding": False}):
        torch._dynamo.reset()
        metrics.reset()
        compiled = engine_compile.CompiledFunction(
            many_reductions, "deterministic", "probe", dynamic=False, extra_options=extra_options
        )
        for ours, expected in zip(compiled(x), many_reductions(x), strict=True):
            assert torch.allclose(ours, expected, rtol=1e-4, atol=1e-5)
        num_paddings.append(metrics.num_comprehensive_padding)
    assert num_paddings[0] > 0 and num_paddings[1] == 0


def test_two_graphs_serve_every_clip_length(decoder_bf16):
    """First chunk + steady chunk; images and other clip lengths reuse them (no traffic recompiles)."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    runner = VaeDecodeRunner(
        copy.deepcopy(decoder_bf16), channels_last=True, compile_backend=counting_backend
    )
    torch._dynamo.reset()
    for num_latent_frames in (4, 1, 2, 5):
        latents = torch.randn(1, 4, num_latent_frames, 2, 3)
        frames = runner.decode_fast_uint8(latents)
        assert frames.shape == (1 + 4 * (num_latent_frames - 1), 32, 48, 3)
    assert len(graphs) == 2


def test_verify_fast_path_falls_back_from_a_miscompile(decoder_bf16, clip_latents, caplog):
    """A compiled step that computes garbage (as torch 2.11 did) is caught: clips of that shape
    decode on the eager step from then on (mstar.engine.checked_compile)."""

    def miscompiling_backend(graph_module, example_inputs):
        def run(*args):
            outputs = graph_module.forward(*args)
            return [o.flip(-2) if o.dtype == torch.uint8 else o for o in outputs]  # wrong frames

        return run

    runner = VaeDecodeRunner(copy.deepcopy(decoder_bf16), compile_backend=miscompiling_backend)
    good = VaeDecodeRunner(copy.deepcopy(decoder_bf16), compile_backend="aot_eager")
    torch._dynamo.reset()
    latents = clip_latents[:, :, :2]
    assert good.verify_fast_path(latents) >= 40.0
    assert good.checked.state(good.shape_key(latents)) == COMPILED
    with caplog.at_level("ERROR", logger="mstar.engine.checked_compile"):
        assert runner.verify_fast_path(latents) < 40.0
    assert "disagrees with eager" in caplog.text
    assert runner.checked.state(runner.shape_key(latents)) == EAGER
    eager_step = runner.decode_fast_uint8(latents, runner._step_uint8)
    assert torch.equal(runner.decode_uint8(latents), eager_step)  # served on the eager step
    assert torch.equal(torch.cat(list(runner.iter_host_uint8(latents))), eager_step)  # in pieces too
    assert uint8_psnr_db(eager_step, runner.decode_plain_uint8(latents)) >= 40.0


def pin_counting_backend(pins_per_graph: list[int]):
    """A compile backend that runs each graph as traced and records how many layout pins it holds."""

    def backend(graph_module, example_inputs):
        nodes = graph_module.graph.nodes
        pins_per_graph.append(sum("inductor_force_stride_order" in str(node.target) for node in nodes))
        return graph_module.forward

    return backend


def test_compiled_decode_keeps_frames_with_the_layout_pins(decoder_bf16):
    """With the residual sums pinned (whatever their count on this CPU's conv layouts), the
    compiled decode writes the eager frames."""
    runner = VaeDecodeRunner(copy.deepcopy(decoder_bf16), channels_last=True, compile_backend="aot_eager")
    torch._dynamo.reset()
    latents = torch.randn(1, 4, 2, 2, 3)
    expected = VaeDecodeRunner(copy.deepcopy(decoder_bf16), channels_last=True).decode_fast_uint8(latents)
    assert torch.equal(runner.decode_fast_uint8(latents), expected)


@pytest.mark.gpu
def test_compiled_decode_pins_residual_sums_channels_last(decoder_bf16):
    """Each residual sum reaches inductor with its stride order fixed (inductor would lay the fresh
    sum out channels-first, and the shortcut conv and norms after it would follow); same frames.

    On CUDA: how many sums trace channels-last follows the conv layouts the device picks, and a
    CPU's choice varies with its ISA (a tiny frame may trace channels-first there)."""
    pins_per_graph = []
    decoder = copy.deepcopy(decoder_bf16).cuda()
    runner = VaeDecodeRunner(
        decoder, channels_last=True, compile_backend=pin_counting_backend(pins_per_graph)
    )
    torch._dynamo.reset()
    latents = torch.randn(1, 4, 2, 2, 3).cuda()
    expected = VaeDecodeRunner(copy.deepcopy(decoder), channels_last=True).decode_fast_uint8(latents)
    assert torch.equal(runner.decode_fast_uint8(latents), expected)
    modules = list(runner.decoder.modules())
    num_sums = sum(isinstance(m, ResidualBlock) for m in modules)
    num_sums += sum(isinstance(m, ResidualUpBlock) and m.avg_shortcut is not None for m in modules)
    assert num_sums > 0 and pins_per_graph == [num_sums, num_sums]  # first chunk, steady chunk


def test_pin_frame_layout_follows_like_and_leaves_eager_alone():
    x = torch.randn(1, 8, 2, 3, 5)
    channels_last = x.contiguous(memory_format=torch.channels_last_3d)
    assert pin_frame_layout(x, like=channels_last) is x  # eager: nothing to do
    pins = []
    for like in (channels_last, x):
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda a, b: pin_frame_layout(a + 1, like=b), backend=pin_counting_backend(pins)
        )
        out = compiled(x, like)
        assert torch.equal(out, x + 1)
        assert out.is_contiguous(memory_format=torch.channels_last_3d) == (like is channels_last)
    assert pins == [1, 0]
