"""Our packed Z-Image DiT against diffusers' ZImageTransformer2DModel (tiny config, fp32, CPU)."""

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import SEQ_MULTI_OF, DiTInput, ZImageDiT
from mstar.models.zimage.optimize import optimize
from mstar.models.zimage.weights import build_dit


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.float() - reference.float()).norm() / reference.float().norm()).item()


@pytest.fixture(scope="module", params=[False, True], ids=["unfused", "fused"])
def models(tiny_folder, request):
    folder, pipe = tiny_folder
    ours = build_dit(TINY.dit, "cpu", torch.float32, model_path=str(folder))  # loads diffusers' keys
    if request.param:
        ours = optimize(ours, fuse=True, kernels=False)
    return ours, pipe.transformer


def make_items(sizes, seed=0):
    """sizes: (latent height, latent width, caption tokens) per item."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for index, (height, width, num_text) in enumerate(sizes):
        latents = torch.randn(16, height, width, generator=generator)
        caption = torch.randn(num_text, TINY.dit.cap_feat_dim, generator=generator)
        items.append(DiTInput(latents, 0.2 + 0.3 * index, caption))
    return items


def diffusers_outputs(transformer, items):
    with torch.no_grad():
        outputs = transformer(
            [item.latents.unsqueeze(1) for item in items],
            torch.tensor([item.timestep for item in items]),
            [item.caption for item in items],
            return_dict=False,
        )[0]
    return [out.squeeze(1) for out in outputs]


def our_outputs(dit, items):
    attn = build_attention("torch", "cpu", torch.float32)
    with torch.no_grad():
        return dit(items, attn)


def test_one_item_matches_diffusers(models):
    ours, reference = models
    # 7 caption tokens and 6*5 image tokens: both padded to 32 with the learned pad tokens.
    items = make_items([(12, 10, 7)])
    (expected,) = diffusers_outputs(reference, items)
    (got,) = our_outputs(ours, items)
    assert got.shape == (16, 12, 10)
    assert relative_error(got, expected) <= 1e-5


def test_two_items_packed_match_diffusers_batch_and_alone(models):
    ours, reference = models
    items = make_items([(8, 12, 40), (16, 8, 5)], seed=1)
    expected = diffusers_outputs(reference, items)
    packed = our_outputs(ours, items)
    for got, want in zip(packed, expected, strict=True):
        assert got.shape == want.shape
        assert relative_error(got, want) <= 1e-5
    for item, got in zip(items, packed, strict=True):
        (alone,) = our_outputs(ours, [item])
        assert relative_error(got, alone) <= 1e-5


def test_inner_pad_tokens_are_attended_as_in_diffusers(models):
    """Diffusers does not mask the pad tokens that round each run up to 32 tokens: real tokens see
    them. Changing the learned pad token must change real outputs in both implementations alike."""
    ours, reference = models
    items = make_items([(6, 6, 3)], seed=2)  # 9 image + 3 caption tokens: mostly padding
    assert 9 % SEQ_MULTI_OF and 3 % SEQ_MULTI_OF
    (before,) = our_outputs(ours, items)
    original = ours.cap_pad_token.detach().clone()
    try:
        with torch.no_grad():
            ours.cap_pad_token.add_(0.5)
            reference.cap_pad_token.add_(0.5)
        (after,) = our_outputs(ours, items)
        (expected,) = diffusers_outputs(reference, items)
    finally:
        with torch.no_grad():
            ours.cap_pad_token.copy_(original)
            reference.cap_pad_token.copy_(original)
    assert relative_error(after, before) > 1e-3
    assert relative_error(after, expected) <= 1e-5


def test_refined_captions_kept_from_an_earlier_step_give_the_same_output(models):
    ours, _ = models
    items = make_items([(12, 10, 7), (8, 8, 40)])
    expected = our_outputs(ours, items)
    attn = build_attention("torch", "cpu", torch.float32)
    with torch.no_grad():
        refined = [ours.refine_caption(item.caption, attn) for item in items]
    assert [r.shape[0] for r in refined] == [SEQ_MULTI_OF, 2 * SEQ_MULTI_OF]  # padded, as in the packed pass
    for item, tokens in zip(items, refined, strict=True):
        item.refined_caption = tokens
        item.caption = torch.full_like(item.caption, float("nan"))  # must not be read again
    for got, want in zip(our_outputs(ours, items), expected, strict=True):
        assert torch.equal(got, want)


def test_denoiser_refines_each_label_once_per_request(models):
    from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem
    from mstar.models.zimage.config import TINY
    from mstar.models.zimage.pipeline import ZImagePipeline

    ours, _ = models
    denoiser = ZImagePipeline(TINY, "cpu", dit=ours, attention=build_attention("torch", "cpu", torch.float32))
    calls = []
    original = ours.refine_caption

    def counting(caption, attn):
        calls.append(caption.shape[0])
        return original(caption, attn)

    ours.refine_caption = counting
    try:
        (first,) = make_items([(8, 8, 5)])
        condition: dict = {}
        for step in range(3):
            items = [
                DenoiseItem(
                    "r", label, first.latents, 900.0 - 100 * step, 0.5, step, first.caption, condition
                )
                for label in (COND, UNCOND)
            ]
            denoiser.predict(items)
    finally:
        del ours.refine_caption
    assert calls == [5, 5]  # one per label, at the first step only
    assert set(condition["refined_captions"]) == {COND, UNCOND}


@pytest.mark.gpu
def test_real_size_bf16_matches_diffusers_at_1024():
    """Real Z-Image-Turbo config, seeded random weights, bf16, one 1024x1024 item (H200)."""
    diffusers = pytest.importorskip("diffusers")
    from mstar.models.zimage.config import REAL, to_json_dict

    device = "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        reference = diffusers.ZImageTransformer2DModel(**to_json_dict(REAL.dit))
    reference = reference.to(torch.bfloat16).eval()
    with torch.no_grad():  # the constructor zero-inits the pad tokens; give them values
        reference.x_pad_token.normal_(std=0.02)
        reference.cap_pad_token.normal_(std=0.02)
    with torch.device("meta"):
        ours = ZImageDiT(REAL.dit)
    ours.load_state_dict(reference.state_dict(), strict=True, assign=True)  # shares the tensors
    ours.eval()
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(16, 128, 128, generator=generator).to(device, torch.bfloat16)
    caption = torch.randn(77, REAL.dit.cap_feat_dim, generator=generator).to(device, torch.bfloat16)
    item = DiTInput(latents, 0.5, caption)
    with torch.no_grad():
        expected = reference(
            [latents.unsqueeze(1)], torch.tensor([0.5], device=device), [caption], return_dict=False
        )[0]
        attn = build_attention("auto", device, torch.bfloat16)
        got = ours([item], attn)
        ours = optimize(
            ours, fuse=True, kernels=False
        )  # the reference keeps the separate tensors (assign=True shared them)
        got_fused = ours([item], attn)
    assert relative_error(got[0], expected[0].squeeze(1)) <= 2e-2
    assert relative_error(got_fused[0], expected[0].squeeze(1)) <= 2e-2
