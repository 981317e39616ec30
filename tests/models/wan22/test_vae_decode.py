"""The serving decode path (mstar.diffusion.vae_decode) vs the plain Wan VAE decode, CPU fp32."""

import copy

import pytest
import torch

from mstar.diffusion.vae_decode import (
    VaeDecodeRunner,
    chunk_bounds,
    convert_to_channels_last,
    to_uint8_frames,
)
from mstar.models.wan22.vae import WanVAEDecoder
from mstar.models.wan22.vae_config import WanVAEConfig

TINY_WAN22 = WanVAEConfig(
    base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
    temperal_downsample=(False, True, True), is_residual=True, in_channels=12, out_channels=12,
    patch_size=2, scale_factor_spatial=16, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4,
)  # fmt: skip


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    module = WanVAEDecoder(TINY_WAN22).eval().requires_grad_(False)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.5, 1.5)
    return module


@pytest.fixture(scope="module")
def latents():
    return torch.randn(1, 4, 3, 2, 3, generator=torch.Generator().manual_seed(1))  # 9 frames, 32x48


def _relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max()).item()


def test_channels_last_fast_path_equals_plain(decoder, latents):
    with torch.no_grad():
        expected = decoder.decode(latents)
    runner = VaeDecodeRunner(copy.deepcopy(decoder), compile_mode="off", channels_last=True)
    conv_weight = runner.decoder.decoder.conv_in.weight
    assert conv_weight.is_contiguous(memory_format=torch.channels_last_3d)
    video = runner.decode_fast_video(latents)
    assert video.shape == expected.shape == (1, 3, 9, 32, 48)
    assert _relative_error(video, expected) <= 1e-5
    frames = runner.decode_fast_uint8(latents)
    expected_frames = to_uint8_frames(expected)[0]
    assert frames.shape == (9, 32, 48, 3) and frames.dtype == torch.uint8
    # float differences of ~1e-7 may flip a rounding at an exact .5 boundary, nothing more
    assert (frames.int() - expected_frames.int()).abs().max() <= 1
    assert (frames == expected_frames).float().mean() > 0.999


def test_multi_frame_chunks_equal_plain(decoder):
    assert chunk_bounds(5, 3) == [(0, 1), (1, 4), (4, 5)]
    assert chunk_bounds(1, 4) == [(0, 1)]
    latents = torch.randn(1, 4, 4, 2, 2, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = decoder.decode(latents)
    runner = VaeDecodeRunner(copy.deepcopy(decoder), chunk_latent_frames=2)  # chunks 1, 2, 1
    video = runner.decode_fast_video(latents)
    assert video.shape == expected.shape == (1, 3, 13, 32, 32)
    assert _relative_error(video, expected) <= 1e-5
    with pytest.raises(ValueError, match="chunk_latent_frames"):
        VaeDecodeRunner(decoder, chunk_latent_frames=0)


def test_plain_path_is_the_eager_decode(decoder, latents):
    runner = VaeDecodeRunner(decoder, compile_mode="off", channels_last=False)
    with torch.no_grad():
        expected = to_uint8_frames(decoder.decode(latents))[0]
    assert torch.equal(runner.decode_uint8(latents, path="plain"), expected)
    assert torch.equal(runner.decode_uint8(latents[0], path="plain"), expected)  # [C, F, H, W] accepted


def test_compile_plumbing_with_eager_backend(decoder, latents):
    eager = VaeDecodeRunner(copy.deepcopy(decoder), compile_mode="off")
    compiled = VaeDecodeRunner(copy.deepcopy(decoder), compile_backend="eager")
    torch._dynamo.reset()
    assert torch.equal(compiled.decode_fast_uint8(latents), eager.decode_fast_uint8(latents))


def test_auto_path_single_image_plain_clip_fast(decoder, latents):
    assert VaeDecodeRunner.choose_path(1) == "plain"
    assert VaeDecodeRunner.choose_path(3) == "fast"
    assert VaeDecodeRunner.choose_path(1, "fast") == "fast"
    runner = VaeDecodeRunner(decoder, compile_mode="off", channels_last=False)
    image_latents = latents[:, :, :1]
    image = runner.decode_uint8(image_latents)
    assert image.shape == (1, 32, 48, 3)
    assert torch.equal(image, runner.decode_plain_uint8(image_latents))
    assert torch.equal(runner.decode_uint8(latents), runner.decode_fast_uint8(latents))


def test_to_uint8_frames_scaling_and_layout():
    video = torch.zeros(1, 3, 2, 1, 2)
    video[0, :, 0, 0, 0] = torch.tensor([-1.0, 0.0, 1.0])
    video[0, :, 1, 0, 1] = torch.tensor([-3.0, 0.5, 7.0])  # clamped
    frames = to_uint8_frames(video)
    assert frames.shape == (1, 2, 1, 2, 3) and frames.dtype == torch.uint8
    assert frames[0, 0, 0, 0].tolist() == [0, 128, 255]
    assert frames[0, 1, 0, 1].tolist() == [0, 191, 255]  # (0.5 + 1) * 127.5 = 191.25


def test_to_uint8_frames_of_bf16_rounds_in_fp32():
    values = torch.linspace(-1, 1, 4001).to(torch.bfloat16).view(1, 1, 1, 1, -1).expand(1, 3, 1, 1, -1)
    expected = ((values.float() + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 4, 1)
    assert torch.equal(to_uint8_frames(values), expected)


def test_cpu_never_compiles_and_bad_inputs_raise(decoder, latents):
    runner = VaeDecodeRunner(copy.deepcopy(decoder), compile_mode="max-autotune")
    assert runner.compile_mode == "off"
    with pytest.raises(ValueError, match="one clip at a time"):
        runner.decode_uint8(latents.expand(2, -1, -1, -1, -1))
    with pytest.raises(ValueError, match="decode path"):
        runner.decode_uint8(latents, path="turbo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compile_mode"):
        VaeDecodeRunner(copy.deepcopy(decoder), compile_mode="fastest")


def test_convert_to_channels_last_keeps_values(decoder):
    converted = convert_to_channels_last(copy.deepcopy(decoder))
    for (name, original), (_, param) in zip(
        decoder.named_parameters(), converted.named_parameters(), strict=True
    ):
        assert torch.equal(original, param), name


def test_host_pieces_are_the_clip_chunk_by_chunk(decoder, latents):
    runner = VaeDecodeRunner(copy.deepcopy(decoder))
    with torch.inference_mode():
        pieces = list(runner.iter_host_uint8(latents))
        image_pieces = list(runner.iter_host_uint8(latents[:, :, :1]))
    assert [tuple(piece.shape) for piece in pieces] == [(1, 32, 48, 3), (4, 32, 48, 3), (4, 32, 48, 3)]
    assert all(piece.device.type == "cpu" and piece.dtype == torch.uint8 for piece in pieces)
    assert torch.equal(torch.cat(pieces), runner.decode_uint8(latents))
    assert len(image_pieces) == 1 and torch.equal(image_pieces[0], runner.decode_uint8(latents[:, :, :1]))


def test_the_node_sends_a_clip_in_pieces_where_the_runtime_takes_them(decoder, latents):
    from mstar.diffusion.vae_nodes import FRAMES, LATENTS, DecodeNode
    from mstar.graph import RequestState
    from mstar.models.wan22.config import tiny_wan22_config
    from mstar.models.wan22.pipeline import WanPipeline

    runner = VaeDecodeRunner(copy.deepcopy(decoder))
    node = DecodeNode(WanPipeline(tiny_wan22_config(), "cpu", torch.float32, decoder=runner))
    whole = RequestState("whole", {}, tensors={LATENTS: latents[0].clone()})
    streamed = RequestState("streamed", {}, tensors={LATENTS: latents[0].clone()})
    sent = []
    streamed.emit_output = lambda key, piece: sent.append((key, piece))
    node.forward([whole, streamed])
    assert [(key, piece.shape[0]) for key, piece in sent] == [(FRAMES, 1), (FRAMES, 4), (FRAMES, 4)]
    assert FRAMES not in streamed.tensors and LATENTS not in streamed.tensors
    assert torch.equal(torch.cat([piece for _, piece in sent]), whole.tensors[FRAMES])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_pieces_on_cuda_are_pinned_copies_of_the_decode(decoder, latents):
    """Each piece's copy is queued behind its chunk and read after the next chunk is queued: the
    pieces must still be exactly the decode (a copy read too early would hold stale frames)."""
    runner = VaeDecodeRunner(copy.deepcopy(decoder).to("cuda", torch.bfloat16))
    clip = torch.randn(1, 4, 6, 8, 12, generator=torch.Generator().manual_seed(5)).to("cuda", torch.bfloat16)
    with torch.inference_mode():
        pieces = list(runner.iter_host_uint8(clip))
    assert [piece.shape[0] for piece in pieces] == [1, 4, 4, 4, 4, 4]
    assert all(piece.device.type == "cpu" and piece.is_pinned() for piece in pieces)
    assert torch.equal(torch.cat(pieces), runner.decode_uint8(clip).cpu())
