"""Nodes: decoder mapping, training output loads strictly into the serving nodes, step costs."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState
from mstar.models.tiny_digits.config import DIT_FILE, TinyDigitsConfig
from mstar.models.tiny_digits.model import TinyDigitsSpec
from mstar.models.tiny_digits.nodes import build_nodes
from mstar.models.tiny_digits.offline import generate
from mstar.models.tiny_digits.pipeline import DigitsPipeline
from mstar.models.tiny_digits.train import Trainer, TrainSettings

NODE_NAMES = TinyDigitsSpec.node_names


def build(weights_dir, random_weights=False):
    ctx = BuildContext(
        config=ServerConfig(),
        device="cpu",
        node_names=NODE_NAMES,
        model_path=str(weights_dir),
        random_weights=random_weights,
    )
    return build_nodes(ctx)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A few training steps written exactly as `python -m mstar.models.tiny_digits.train` writes them."""
    from mstar.models.tiny_digits import data

    torch.set_num_threads(1)
    weights_dir = tmp_path_factory.mktemp("weights")
    train_split, _ = data.load_splits()
    trainer = Trainer(TinyDigitsConfig(), TrainSettings(num_steps=3, batch_size=4, log_every=1))
    result = trainer.fit(
        data.upscale_to_model(train_split.images_8px[:32], 16), torch.from_numpy(train_split.labels[:32])
    )
    assert [step for step, _ in result.loss_curve] == [1, 2, 3]
    trainer.save(weights_dir)
    return weights_dir


def test_decoder_maps_ink_to_dark_pixels_on_white():
    decoder = DigitsPipeline(TinyDigitsConfig(output_size=256), "cpu")
    blank = decoder.decode(torch.full((1, 1, 16, 16), -1.0))
    inked = decoder.decode(torch.full((1, 1, 16, 16), 1.0))
    assert blank.shape == (1, 256, 256, 3) and blank.dtype == torch.uint8
    assert int(blank.min()) == 255 and int(inked.max()) == 0


def test_trained_weights_load_strictly_and_generate(trained_dir):
    nodes = build(trained_dir)
    assert set(nodes) == set(NODE_NAMES)
    frames = generate(nodes, [GenerationParams(prompt="7", seed=0, num_inference_steps=2)])
    assert frames[0].shape == (1, 256, 256, 3) and frames[0].dtype == np.uint8


def test_missing_tensor_fails_naming_it(trained_dir, tmp_path):
    for path in trained_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    state = load_file(str(trained_dir / DIT_FILE))
    state.pop("proj_out.weight")
    save_file(state, str(tmp_path / DIT_FILE))
    with pytest.raises(RuntimeError, match="proj_out.weight"):
        build(tmp_path)


def test_random_weights_need_only_config_and_vocab(trained_dir, tmp_path):
    for name in ("config.json", "vocab.json"):
        (tmp_path / name).write_bytes((trained_dir / name).read_bytes())
    nodes = build(tmp_path, random_weights=True)
    again = build(tmp_path, random_weights=True)
    for name, param in nodes["dit"].pipeline.dit.state_dict().items():
        assert torch.equal(param, again["dit"].pipeline.dit.state_dict()[name]), name


def test_guidance_doubles_the_step_cost(trained_dir):
    nodes = build(trained_dir)
    spec = TinyDigitsSpec()
    guided = RequestState("a", spec.validate(GenerationParams(prompt="7", seed=0, guidance_scale=3.0)))
    plain = RequestState("b", spec.validate(GenerationParams(prompt="7", seed=0, guidance_scale=1.0)))
    nodes["text_encoder"].forward([guided, plain])
    embeds = guided.tensors["prompt_embeds"]
    assert embeds.shape == (2, 32)  # <bos> + "7"
    assert guided.tensors["negative_prompt_embeds"].shape == (1, 32)
    dit = nodes["dit"]
    for request in (guided, plain):
        dit.prepare(request)
    tokens_per_image = (16 // 4) ** 2
    assert dit.step_cost(guided) == 2 * tokens_per_image
    assert dit.step_cost(plain) == tokens_per_image
    assert dit.batch_key(guided) == dit.batch_key(plain)


def test_shipped_dit_is_a_diffusers_wan_transformer():
    """The shipped weights load strictly into diffusers' WanTransformer3DModel and predict the same."""
    diffusers = pytest.importorskip("diffusers")
    from mstar.models.tiny_digits.config import WEIGHTS_DIR
    from mstar.models.tiny_digits.offline import build_local_nodes
    from mstar.models.wan22.dit import DiTInput

    config = TinyDigitsConfig.load(WEIGHTS_DIR / "config.json")
    reference = diffusers.WanTransformer3DModel(
        **{**config.dit, "patch_size": tuple(config.dit["patch_size"])}
    )
    reference.load_state_dict(load_file(str(WEIGHTS_DIR / DIT_FILE)), strict=True)
    ours = build_local_nodes()["dit"].pipeline
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 1, 16, 16, generator=generator)  # [C, F, H, W]
    text = torch.randn(3, config.text_dim, generator=generator)
    with torch.no_grad():
        expected = reference(latents[None], torch.tensor([700.0]), text[None], return_dict=False)[0][0]
        actual = ours.dit([DiTInput(latents, 700.0, text)], ours.attention)[0]
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4)
