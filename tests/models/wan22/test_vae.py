"""Our Wan VAE vs diffusers' AutoencoderKLWan: tiny configs, random weights, fp32 on CPU."""

import json

import pytest
import torch

from mstar.models.wan22.vae import (
    WanVAE,
    WanVAEDecoder,
    WanVAEEncoder,
    decoder_only,
    denormalize_latents,
    load_wan_vae,
    normalize_latents,
)
from mstar.models.wan22.vae_config import WAN22_TI2V_5B_VAE_CONFIG, WanVAEConfig

diffusers = pytest.importorskip("diffusers")

# Wan 2.2 layout (residual blocks, patch 2, 4x16x16) and Wan 2.1 layout (plain blocks, 4x8x8), tiny.
TINY_WAN22 = dict(
    base_dim=8, decoder_base_dim=12, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
    temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
    patch_size=2, scale_factor_spatial=16, latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[0.5, 1.0, 2.0, 0.7],
)  # fmt: skip
TINY_WAN21 = dict(
    base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
    latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
)  # fmt: skip
VARIANTS = {"wan22": (TINY_WAN22, 16), "wan21": (TINY_WAN21, 8)}


def _relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-12)).item()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def saved_vae(request, tmp_path_factory):
    """(diffusers model, its save_pretrained folder, spatial compression)."""
    config, compression = VARIANTS[request.param]
    torch.manual_seed(0)
    reference = diffusers.AutoencoderKLWan(**config).eval()
    with torch.no_grad():  # non-trivial gains so a mixed-up norm would show
        for name, param in reference.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp(request.param) / "vae"
    reference.save_pretrained(folder)
    return reference, folder, compression


def test_decode_matches_diffusers(saved_vae):
    reference, folder, compression = saved_vae
    ours = load_wan_vae(folder)
    latents = torch.randn(1, 4, 3, 2, 3, generator=torch.Generator().manual_seed(1))  # 9 frames
    with torch.no_grad():
        expected = reference.decode(latents).sample
        video = ours.decode(latents)
    assert video.shape == (1, 3, 9, 2 * compression, 3 * compression)
    assert video.shape == expected.shape
    assert _relative_error(video, expected) <= 1e-5
    assert video.abs().max() <= 1.0


def test_encode_matches_diffusers(saved_vae):
    reference, folder, compression = saved_vae
    ours = load_wan_vae(folder)
    video = (
        torch.rand(1, 3, 5, compression, 2 * compression, generator=torch.Generator().manual_seed(2)) * 2 - 1
    )
    with torch.no_grad():
        expected = reference.encode(video).latent_dist.mode()
        mean = ours.encode(video)
        first_frame = ours.encode(video[:, :, :1])
        expected_first = reference.encode(video[:, :, :1]).latent_dist.mode()
    assert mean.shape == expected.shape == (1, 4, 2, 1, 2)
    assert _relative_error(mean, expected) <= 1e-5
    assert _relative_error(first_frame, expected_first) <= 1e-5


def test_decoder_only_loads_and_matches(saved_vae):
    _, folder, _ = saved_vae
    full = load_wan_vae(folder)
    served = load_wan_vae(folder, decoder_only=True)
    assert isinstance(served, WanVAEDecoder)
    assert not any(name.startswith("encoder.") for name in served.state_dict())
    shared = decoder_only(full)
    assert shared.decoder is full.decoder
    latents = torch.randn(1, 4, 2, 2, 2)
    with torch.no_grad():
        assert torch.equal(served.decode(latents), full.decode(latents))
        assert torch.equal(shared.decode(latents), full.decode(latents))


def test_encoder_only_loads_and_matches(saved_vae):
    _, folder, _ = saved_vae
    full = load_wan_vae(folder)
    served = load_wan_vae(folder, encoder_only=True)
    assert isinstance(served, WanVAEEncoder)
    assert not any(name.startswith(("decoder.", "post_quant_conv.")) for name in served.state_dict())
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(served.encode(video), full.encode(video))
    with pytest.raises(ValueError, match="exclude each other"):
        load_wan_vae(folder, decoder_only=True, encoder_only=True)


def test_encoder_only_random_weights_equal_the_full_vaes():
    """Seeded random weights follow state-dict order: the encoder-only copy must get the full VAE's
    encoder, so a random-weight server encodes as before."""
    from mstar.models.checkpoint import build_module

    config = WanVAEConfig.from_dict(TINY_WAN22)
    full = build_module(lambda: WanVAE(config), "cpu", torch.float32, seed=4)
    served = build_module(lambda: WanVAEEncoder(config), "cpu", torch.float32, seed=4)
    full_weights = full.state_dict()
    for name, tensor in served.state_dict().items():
        assert torch.equal(tensor, full_weights[name]), name


def test_state_dict_keys_equal_diffusers(saved_vae):
    reference, folder, _ = saved_vae
    config = WanVAEConfig.from_json_file(folder / "config.json")
    ours = WanVAE(config)
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert ours_shapes == {k: tuple(v.shape) for k, v in reference.state_dict().items()}


def test_real_wan22_config_keys_equal_diffusers():
    """The real TI2V-5B layout, built on the meta device (no memory), has diffusers' exact keys."""
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(WAN22_TI2V_5B_VAE_CONFIG).items()}
    with torch.device("meta"):
        reference = diffusers.AutoencoderKLWan(**fields)
        ours = WanVAE(WAN22_TI2V_5B_VAE_CONFIG)
    ours_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    assert ours_shapes == {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    assert WAN22_TI2V_5B_VAE_CONFIG.z_dim == len(WAN22_TI2V_5B_VAE_CONFIG.latents_std) == 48


def test_real_config_json_parses_to_the_wan22_constant():
    """Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json (metadata and clip_output included)."""
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in vars(WAN22_TI2V_5B_VAE_CONFIG).items()}
    raw = {
        "_class_name": "AutoencoderKLWan",
        "_diffusers_version": "0.35.0",
        "attn_scales": [],
        "dropout": 0.0,
    }
    raw.update(fields, clip_output=False)
    assert WanVAEConfig.from_dict(json.loads(json.dumps(raw))) == WAN22_TI2V_5B_VAE_CONFIG
    assert WAN22_TI2V_5B_VAE_CONFIG.decoder_dim == 256 and WAN22_TI2V_5B_VAE_CONFIG.patch == 2


def test_load_errors_name_the_tensor(saved_vae, tmp_path):
    from safetensors.torch import load_file, save_file

    _, folder, _ = saved_vae
    tensors = load_file(folder / "diffusion_pytorch_model.safetensors")
    broken = tmp_path / "vae"
    broken.mkdir()
    (broken / "config.json").write_text((folder / "config.json").read_text())
    del tensors["decoder.conv_out.bias"]
    tensors["decoder.extra.weight"] = torch.zeros(1)
    save_file(tensors, broken / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match="decoder.extra.weight"):
        load_wan_vae(broken)
    del tensors["decoder.extra.weight"]
    save_file(tensors, broken / "diffusion_pytorch_model.safetensors")
    with pytest.raises(ValueError, match="decoder.conv_out.bias"):
        load_wan_vae(broken)


def test_latent_normalisation_round_trip_and_matches_pipeline_arithmetic():
    config = WanVAEConfig.from_dict(json.loads(json.dumps(TINY_WAN22)))
    latents = torch.randn(1, 4, 2, 3, 3)
    mean = torch.tensor(TINY_WAN22["latents_mean"]).view(1, 4, 1, 1, 1)
    recip_std = 1.0 / torch.tensor(TINY_WAN22["latents_std"]).view(1, 4, 1, 1, 1)
    assert torch.equal(denormalize_latents(latents, config), latents / recip_std + mean)
    assert torch.allclose(normalize_latents(denormalize_latents(latents, config), config), latents, atol=1e-6)


def test_bad_inputs_raise_clear_errors():
    config = WanVAEConfig.from_dict(TINY_WAN22)
    vae = WanVAE(config)
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        vae.encode(torch.zeros(1, 3, 4, 32, 32))
    with pytest.raises(ValueError, match="latents must be"):
        vae.decode(torch.zeros(1, 5, 1, 2, 2))
    with pytest.raises(ValueError, match="unknown Wan VAE config key"):
        WanVAEConfig.from_dict({"z_dim": 4, "bogus": 1})
