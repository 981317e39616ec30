"""Our packed FLUX.2 transformer against diffusers' Flux2Transformer2DModel (tiny config, fp32,
CPU): one item, items with references, and many items of different sizes packed in one forward
equal to each alone."""

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.models.flux2_klein.config import TINY
from mstar.models.flux2_klein.dit import DiTInput
from mstar.models.flux2_klein.weights import build_dit

CHANNELS = TINY.transformer.in_channels
TEXT_DIM = TINY.transformer.joint_attention_dim


def psnr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Peak signal (the reference's max magnitude) to the error, in dB."""
    error = (ours.double() - reference.double()).pow(2).mean().item()
    peak = reference.double().abs().max().item()
    return float("inf") if error == 0 else 10 * torch.log10(torch.tensor(peak**2 / error)).item()


@pytest.fixture(scope="module")
def models(tiny_folder):
    folder, pipe = tiny_folder
    ours = build_dit(TINY.transformer, "cpu", torch.float32, model_path=str(folder))  # diffusers' keys
    return ours, pipe.transformer


def make_item(rows, cols, references=(), timestep=500.0, num_text=TINY.max_sequence_length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return DiTInput(
        latents=torch.randn(CHANNELS, rows, cols, generator=generator),
        timestep=timestep,
        text=torch.randn(num_text, TEXT_DIM, generator=generator),
        references=[torch.randn(CHANNELS, r, c, generator=generator) for r, c in references],
    )


def diffusers_output(transformer, item: DiTInput) -> torch.Tensor:
    """The transformer called as Flux2KleinPipeline calls it: packed tokens, position ids and the
    timestep cast to the latents' dtype, then / 1000."""
    from diffusers import Flux2KleinPipeline as Pipe

    latents = item.latents[None]
    device = latents.device
    hidden, image_ids = Pipe._pack_latents(latents), Pipe._prepare_latent_ids(latents)
    if item.references:
        references = [r[None] for r in item.references]
        packed = torch.cat([Pipe._pack_latents(r)[0] for r in references])[None]
        hidden = torch.cat([hidden, packed], dim=1)
        image_ids = torch.cat([image_ids, Pipe._prepare_image_ids(references)], dim=1)
    text = item.text[None]
    timestep = torch.tensor([item.timestep], dtype=torch.float32, device=device).to(latents.dtype)
    with torch.no_grad():
        out = transformer(
            hidden_states=hidden, timestep=timestep / 1000, guidance=None, encoder_hidden_states=text,
            txt_ids=Pipe._prepare_text_ids(text).to(device), img_ids=image_ids.to(device), return_dict=False,
        )[0]  # fmt: skip
    channels, rows, cols = item.latents.shape
    return out[0, : rows * cols].transpose(0, 1).reshape(channels, rows, cols)


def our_outputs(dit, items):
    with torch.no_grad():
        return dit(items, build_attention("torch", "cpu", torch.float32))


@pytest.mark.parametrize(
    "rows, cols, references",
    [(6, 5, ()), (4, 8, ((6, 4),)), (5, 5, ((4, 4), (3, 7)))],
    ids=["text-to-image", "one-reference", "two-references"],
)
def test_one_item_matches_diffusers(models, rows, cols, references):
    ours, reference = models
    item = make_item(rows, cols, references, timestep=731.25, seed=rows)
    (got,) = our_outputs(ours, [item])
    expected = diffusers_output(reference, item)
    assert got.shape == (CHANNELS, rows, cols)
    assert psnr_db(got, expected) >= 100  # the same fp32 arithmetic (0 difference on x86 here)


def test_references_change_the_output(models):
    """Reference tokens take part in joint attention: dropping one changes the output tokens."""
    ours, _ = models
    with_refs = make_item(4, 4, ((4, 4), (2, 8)), seed=3)
    without = DiTInput(with_refs.latents, with_refs.timestep, with_refs.text, with_refs.references[:1])
    (a,), (b,) = our_outputs(ours, [with_refs]), our_outputs(ours, [without])
    assert psnr_db(b, a) < 60


def gemm_rows_are_independent(num_rows: int = 64) -> bool:
    """Whether this CPU's fp32 GEMM gives a row the same bits whatever the other rows (it does for
    the row counts used here on x86 with MKL; small-matrix kernels may not)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(TINY.transformer.inner_dim, TINY.transformer.inner_dim, generator=generator)
    x = torch.randn(num_rows, weight.shape[1], generator=generator)
    full = x @ weight.T
    return all(torch.equal((x[:n] @ weight.T), full[:n]) for n in (16, 24, 32, 40))


def test_packed_items_equal_each_alone_and_diffusers(models):
    """Requests of different sizes, timesteps and reference counts in one forward (each text is
    the pipeline's full max_sequence_length): each item's output is its output alone."""
    ours, reference = models
    items = [
        make_item(4, 6, (), timestep=980.0, seed=10),
        make_item(6, 4, ((4, 4), (2, 6)), timestep=500.0, seed=11),
        make_item(4, 4, ((6, 6),), timestep=120.5, seed=12),
        make_item(8, 2, ((4, 5),), timestep=980.0, seed=13),
    ]
    packed = our_outputs(ours, items)
    exact = gemm_rows_are_independent()
    for item, got in zip(items, packed, strict=True):
        (alone,) = our_outputs(ours, [item])
        if exact:
            assert torch.equal(got, alone)
        else:
            assert psnr_db(got, alone) >= 60
        assert psnr_db(got, diffusers_output(reference, item)) >= 60


def test_item_order_does_not_matter(models):
    ours, _ = models
    items = [make_item(4, 4, ((4, 4),), seed=20), make_item(6, 6, (), seed=21)]
    forward = our_outputs(ours, items)
    backward = our_outputs(ours, items[::-1])[::-1]
    for a, b in zip(forward, backward, strict=True):
        assert psnr_db(a, b) >= 60


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["klein-4b", "klein-9b"])
def test_real_size_bf16_matches_diffusers(preset):
    """Real klein config, seeded random weights, bf16 on the GPU: a 1024x1024 text-to-image item
    (64 x 64 tokens, 512 text tokens) and one with two 1024x1024 references, against diffusers."""
    diffusers = pytest.importorskip("diffusers")
    from mstar.models.flux2_klein.config import PRESETS, to_json_dict
    from mstar.models.flux2_klein.dit import Flux2DiT

    config = PRESETS[preset].transformer
    device = "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        reference = diffusers.Flux2Transformer2DModel(**to_json_dict(config))
    reference = reference.to(torch.bfloat16).eval()
    with torch.device("meta"):
        ours = Flux2DiT(config)
    ours.load_state_dict(reference.state_dict(), strict=True, assign=True)  # shares the tensors
    ours.eval()
    generator = torch.Generator().manual_seed(0)
    for references in ((), ((64, 64), (64, 64))):
        item = DiTInput(
            torch.randn(config.in_channels, 64, 64, generator=generator).to(device, torch.bfloat16),
            700.0,
            torch.randn(512, config.joint_attention_dim, generator=generator).to(device, torch.bfloat16),
            [
                torch.randn(config.in_channels, r, c, generator=generator).to(device, torch.bfloat16)
                for r, c in references
            ],
        )
        with torch.no_grad():
            expected = diffusers_output(reference, item)
            (got,) = ours([item], build_attention("auto", device, torch.bfloat16))
        error = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
        assert error <= 2e-2, f"{preset} with {len(references)} references: relative error {error:.4f}"
