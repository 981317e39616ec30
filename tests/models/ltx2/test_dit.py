"""Our packed LTX-2 DiT against diffusers' LTX2VideoTransformer3DModel (tiny configs, fp32, CPU):
both streams, every guidance label, and many items of different sizes and durations in one forward
equal to each item alone."""

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.models.ltx2.dit import DiTInput, LTX2DiT
from mstar.models.ltx2.presets import TINY
from tests.models.ltx2.reference import diffusers_forward, snr_db
from tests.models.ltx2.tiny_parts import TINY_DIT_23, TINY_DIT_25, tiny_transformer

pytest.importorskip("diffusers")

MIN_SNR_DB = 60.0
PERTURBED_BLOCKS = (1,)


@pytest.fixture(scope="module", params=["ltx2", "ltx2.3", "ltx2.5"])
def models(request):
    config = {"ltx2": TINY.dit, "ltx2.3": TINY_DIT_23, "ltx2.5": TINY_DIT_25}[request.param]
    theirs = tiny_transformer(config)
    ours = LTX2DiT(config).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)  # diffusers' keys
    return ours, theirs


def _item(seed, frames, height, width, audio_frames, timestep, text_len=6, **kwargs) -> DiTInput:
    c = TINY.dit
    generator = torch.Generator().manual_seed(seed)
    text_dim = c.caption_channels if c.use_prompt_embeddings else None
    video = torch.randn(c.in_channels, frames, height, width, generator=generator)
    audio = torch.randn(2, audio_frames, c.audio_in_channels // 2, generator=generator)
    video_text = torch.randn(text_len, text_dim or c.cross_attention_dim, generator=generator)
    audio_text = torch.randn(text_len, text_dim or c.audio_cross_attention_dim, generator=generator)
    return DiTInput(video, audio, timestep, video_text, audio_text, **kwargs)


def _for(model: LTX2DiT, item: DiTInput) -> DiTInput:
    """The item with text of the width this model's blocks read (no caption projection in 2.3)."""
    c = model.config
    if c.use_prompt_embeddings:
        return item
    generator = torch.Generator().manual_seed(int(item.timestep))
    tokens = item.video_text.shape[0]
    item.video_text = torch.randn(tokens, c.cross_attention_dim, generator=generator)
    item.audio_text = torch.randn(tokens, c.audio_cross_attention_dim, generator=generator)
    return item


def _ours(model, items, perturbed_blocks=PERTURBED_BLOCKS):
    with torch.no_grad():
        return model(items, build_attention("torch", "cpu", torch.float32), perturbed_blocks)


def _check(out, reference):
    video, audio = out
    ref_video, ref_audio = reference
    assert video.shape == ref_video.shape and audio.shape == ref_audio.shape
    assert snr_db(video, ref_video) >= MIN_SNR_DB
    assert snr_db(audio, ref_audio) >= MIN_SNR_DB


def test_one_item_matches_diffusers_on_both_streams(models):
    ours, theirs = models
    item = _for(ours, _item(1, 3, 4, 6, 7, 700.0, frame_rate=8.0))
    (out,) = _ours(ours, [item])
    _check(out, diffusers_forward(theirs, item))


@pytest.mark.parametrize("use_cross_timestep", [True, False])
def test_image_to_video_clean_first_frame_matches_per_token_timesteps(models, use_cross_timestep):
    ours, theirs = models
    item = _for(ours, _item(2, 3, 4, 4, 5, 600.0, num_clean_frames=1, use_cross_timestep=use_cross_timestep))
    (out,) = _ours(ours, [item])
    _check(out, diffusers_forward(theirs, item))
    (no_mask,) = _ours(ours, [_for(ours, _item(2, 3, 4, 4, 5, 600.0, use_cross_timestep=use_cross_timestep))])
    assert snr_db(no_mask[0], out[0]) < 40  # the clean frame's timestep changes the output


def test_isolated_and_perturbed_labels_match_diffusers(models):
    ours, theirs = models
    isolated = _for(ours, _item(3, 2, 4, 4, 6, 300.0, isolated=True))
    (out,) = _ours(ours, [isolated])
    _check(out, diffusers_forward(theirs, isolated))
    perturbed = _for(ours, _item(4, 2, 4, 4, 6, 300.0, perturbed=True))
    (out,) = _ours(ours, [perturbed])
    _check(out, diffusers_forward(theirs, perturbed, PERTURBED_BLOCKS))


def test_many_items_packed_equal_each_alone(models):
    """Requests of different sizes, durations, timesteps, frame rates and labels in one forward."""
    ours, theirs = models
    items = [
        _for(ours, _item(10, 3, 4, 6, 7, 900.0, frame_rate=8.0)),
        _for(ours, _item(11, 2, 8, 4, 3, 450.0, text_len=4, isolated=True)),
        _for(ours, _item(12, 3, 4, 4, 9, 120.0, num_clean_frames=1, frame_rate=12.0)),
        _for(ours, _item(13, 1, 4, 4, 2, 30.0, perturbed=True)),
        _for(ours, _item(14, 2, 4, 8, 5, 450.0, text_len=8)),
    ]
    packed = _ours(ours, items)
    for out, item in zip(packed, items, strict=True):
        (alone,) = _ours(ours, [item])
        assert snr_db(out[0], alone[0]) >= MIN_SNR_DB and snr_db(out[1], alone[1]) >= MIN_SNR_DB
        _check(out, diffusers_forward(theirs, item, PERTURBED_BLOCKS))


def test_items_at_one_timestep_share_one_modulation_row():
    """A guided step's labels of one request (cond, uncond, isolated: one timestep) and the clean
    frames of two image-to-video items compute each distinct timestep's modulation once, and each
    item's output is what it gives alone."""
    from mstar.models.ltx2.dit_pack import build_layout

    theirs = tiny_transformer(TINY.dit)
    ours = LTX2DiT(TINY.dit).eval()
    ours.load_state_dict(theirs.state_dict())
    items = [
        _item(30, 2, 4, 6, 5, 700.0),  # cond
        _item(31, 2, 4, 6, 5, 700.0, text_len=4),  # uncond: its own text, the same timestep
        _item(30, 2, 4, 6, 5, 700.0, isolated=True),
        _item(32, 3, 4, 4, 3, 300.0, num_clean_frames=1),
        _item(33, 2, 4, 4, 3, 700.0, num_clean_frames=1),
    ]
    assert build_layout(items, TINY.dit).timesteps.tolist() == [700.0, 300.0, 0.0]
    calls = []
    hook = ours.time_embed.linear.register_forward_hook(lambda *args: calls.append(1))
    try:
        packed = _ours(ours, items)
    finally:
        hook.remove()
    assert len(calls) == 3  # one modulation row per distinct timestep, none for padding
    for out, item in zip(packed, items, strict=True):
        (alone,) = _ours(ours, [item])
        assert snr_db(out[0], alone[0]) >= MIN_SNR_DB and snr_db(out[1], alone[1]) >= MIN_SNR_DB
        _check(out, diffusers_forward(theirs, item, PERTURBED_BLOCKS))


def test_packed_is_byte_identical_to_alone_in_fp32():
    """Packing changes no arithmetic an item sees: fp32 outputs are equal, not just close.

    CPU BLAS computes a partial block of rows (and a thread's share) with other kernels, so every
    segment here is 672 rows (a multiple of every row block we know of) and BLAS runs on one
    thread; the other tests check packed against alone at any sizes (>= 60 dB)."""
    theirs = tiny_transformer(TINY.dit)
    ours = LTX2DiT(TINY.dit).eval()
    ours.load_state_dict(theirs.state_dict())
    rows = 672
    items = [
        _item(20, 7, 8, 12, rows, 800.0, text_len=rows),
        _item(21, 7, 12, 8, rows, 200.0, text_len=rows, isolated=True),
        _item(22, 7, 8, 12, rows, 50.0, text_len=rows, num_clean_frames=1),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        packed = _ours(ours, items)
        alone = [_ours(ours, [item])[0] for item in items]
    finally:
        torch.set_num_threads(threads)
    for out, single in zip(packed, alone, strict=True):
        assert torch.equal(out[0], single[0]) and torch.equal(out[1], single[1])


def test_audio_video_cross_attention_links_the_streams():
    theirs = tiny_transformer(TINY.dit)
    ours = LTX2DiT(TINY.dit).eval()
    ours.load_state_dict(theirs.state_dict())
    item = _item(30, 2, 4, 4, 5, 500.0)
    other_audio = _item(31, 2, 4, 4, 5, 500.0)
    changed = DiTInput(item.video_latents, other_audio.audio_latents, 500.0, item.video_text, item.audio_text)
    (base,), (moved,) = _ours(ours, [item]), _ours(ours, [changed])
    assert snr_db(moved[0], base[0]) < 60  # the video hears the audio
    (isolated,) = _ours(ours, [DiTInput(**{**item.__dict__, "isolated": True})])
    (isolated_moved,) = _ours(ours, [DiTInput(**{**changed.__dict__, "isolated": True})])
    assert torch.equal(isolated[0], isolated_moved[0])  # isolated, it does not


def test_bad_latents_are_rejected():
    ours = LTX2DiT(TINY.dit).eval()
    bad = _item(40, 2, 4, 4, 5, 1.0)
    bad.video_latents = torch.zeros(3, 1, 4, 4)
    with pytest.raises(ValueError, match="video_latents"):
        _ours(ours, [bad])
    bad = _item(41, 2, 4, 4, 5, 1.0)
    bad.audio_latents = torch.zeros(3, 5, 4)
    with pytest.raises(ValueError, match="audio_latents"):
        _ours(ours, [bad])


def test_every_block_runs_one_compiled_graph():
    """The stack compiles one block, which all blocks reuse (their weights are its inputs): a
    4-block model compiles one graph, not one a block, and its output is the eager one's."""
    from dataclasses import replace

    from mstar.engine.compile import compile_methods

    model = LTX2DiT(replace(TINY.dit, num_layers=4)).eval()
    eager = LTX2DiT(replace(TINY.dit, num_layers=4)).eval()
    eager.load_state_dict(model.state_dict())
    parts = compile_methods(model, LTX2DiT.compiled_methods, "deterministic", "test", backend="eager")
    items = [_item(30, 3, 4, 6, 5, 700.0), _item(31, 5, 4, 4, 3, 300.0, isolated=True)]
    out = _ours(model, items)
    assert {part.name: part.num_compiles for part in parts.parts} == {
        "test.run_block": 1,
        "test.run_heads": 1,
    }
    reference = _ours(eager, items)
    for (video, audio), (ref_video, ref_audio) in zip(out, reference, strict=True):
        assert torch.equal(video, ref_video) and torch.equal(audio, ref_audio)


@pytest.mark.parametrize("fuse", [False, True])
def test_kernel_norm_rotary_swap_equals_the_eager_model(models, fuse, monkeypatch):
    """optimize(kernels=True) routes every rotary attention's q/k norm + split rotary through
    mstar::qk_norm_rotary (its CPU definition here) and changes no output; the interleaved layout
    keeps the eager code."""
    import copy

    from mstar.engine.kernels import qk_norm_rotary as op_module
    from mstar.models.ltx2.optimize import optimize

    eager, _ = models
    swapped = optimize(copy.deepcopy(eager), fuse=fuse, kernels=True)
    calls = []
    reference = op_module.qk_norm_rotary_reference
    monkeypatch.setattr(op_module, "qk_norm_rotary_reference", lambda *a: calls.append(1) or reference(*a))
    items = [_for(eager, _item(50, 3, 4, 6, 5, 700.0)), _for(eager, _item(51, 5, 4, 4, 3, 300.0))]
    got, want = _ours(swapped, items), _ours(eager, items)
    for (video, audio), (ref_video, ref_audio) in zip(got, want, strict=True):
        torch.testing.assert_close(video, ref_video, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(audio, ref_audio, rtol=1e-5, atol=1e-5)
    split = eager.config.rope_type == "split"
    # per block: video and audio self attention, a2v and v2a, each for queries and keys
    assert len(calls) == (8 * eager.config.num_layers if split else 0)
    from mstar.models.ltx2.optimize import SigmoidGeluProj

    for block in swapped.transformer_blocks:  # the feed-forwards' GELU in its sigmoid form
        assert isinstance(block.ff.net[0], SigmoidGeluProj)
        assert isinstance(block.audio_ff.net[0], SigmoidGeluProj)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sigmoid_form_of_the_gelu_equals_the_tanh_form(dtype):
    """x * sigmoid(2u) is gelu(x, tanh): within float32 rounding, and in bf16 the same values but
    for a few rounding ties and the tiniest (x far below zero, where 1 + tanh u cancels)."""
    from mstar.models.ltx2.dit_layers import GeluProj
    from mstar.models.ltx2.optimize import SigmoidGeluProj

    torch.manual_seed(0)
    eager = GeluProj(16, 64, bias=True).to(dtype)
    sigmoid_form = GeluProj(16, 64, bias=True).to(dtype)
    sigmoid_form.load_state_dict(eager.state_dict())
    sigmoid_form.__class__ = SigmoidGeluProj
    x = (torch.randn(4096, 16) * 3).to(dtype)
    with torch.no_grad():
        got, want = sigmoid_form(x), eager(x)
    assert got.dtype == want.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    else:  # a rounding tie may land either side: at most one bf16 place (2^-8 relative) apart
        torch.testing.assert_close(got, want, rtol=2.0**-7, atol=2e-5)
        assert (got == want).float().mean() > 0.95


def test_text_keys_and_values_kept_across_steps_equal_the_projected_text():
    """text_kv of an item's texts, passed in, gives the same bytes as the forward projecting them;
    a wrongly shaped one is refused; LTX-2.3 (text modulated per step) keeps none."""
    import dataclasses

    theirs = tiny_transformer(TINY.dit)
    ours = LTX2DiT(TINY.dit).eval()
    ours.load_state_dict(theirs.state_dict())
    items = [_item(40, 2, 4, 6, 5, 700.0), _item(41, 3, 4, 4, 3, 300.0, text_len=4, isolated=True)]
    with torch.no_grad():
        kept = [dataclasses.replace(it, text_kv=ours.text_kv(it.video_text, it.audio_text)) for it in items]
        video_kv, audio_kv = kept[0].text_kv
    assert video_kv.shape[:3] == (TINY.dit.num_layers, 2, 6) and audio_kv.shape[:3] == (
        TINY.dit.num_layers,
        2,
        6,
    )
    for (video, audio), (ref_video, ref_audio) in zip(_ours(ours, kept), _ours(ours, items), strict=True):
        assert torch.equal(video, ref_video) and torch.equal(audio, ref_audio)
    wrong = dataclasses.replace(items[0], text_kv=kept[1].text_kv)  # another text's length
    with pytest.raises(ValueError, match="text_kv must be"):
        _ours(ours, [wrong])
    modulated = LTX2DiT(TINY_DIT_23).eval()
    assert not modulated.keeps_text_kv
    with pytest.raises(ValueError, match="modulates its text"):
        modulated.text_kv(items[0].video_text, items[0].audio_text)


def test_the_pipeline_projects_each_text_of_a_request_once():
    """Across a guided request's steps the serving pipeline projects its prompt once (cond and the
    isolated pass share it) and its negative prompt once, and the node drops both at its last step."""
    import msgspec

    from mstar.graph import GenerationParams
    from mstar.models.ltx2.geometry import COND, ISOLATED, UNCOND
    from mstar.models.ltx2.pipeline import TEXT_KV
    from tests.models.ltx2.served import build_nodes, new_request
    from tests.models.ltx2.tiny_spec import TinyLTX2Spec

    spec = TinyLTX2Spec()
    nodes = build_nodes(spec, names=("text_encoder", "dit"))
    dit_node = nodes["dit"]
    dit = dit_node.pipeline.dit
    projected = []
    text_kv = dit.text_kv
    dit.text_kv = lambda *texts: projected.append(1) or text_kv(*texts)
    params = spec.validate(GenerationParams(prompt="a robot", negative_prompt="the cat", seed=3))
    fields = {
        **msgspec.structs.asdict(params),
        "width": 32,
        "height": 32,
        "num_frames": 5,
        "num_inference_steps": 3,
    }
    request = new_request(spec, "r", **fields)
    nodes["text_encoder"].forward([request])
    dit_node.prepare(request)
    assert set(spec.labels(request.params)) >= {COND, UNCOND, ISOLATED}
    condition = request.state[dit_node.name].condition
    for _ in range(2):
        dit_node.forward([request])
    assert len(projected) == 2 and len(condition[TEXT_KV]) == 2
    dit_node.forward([request])  # the last step
    assert dit_node.check_stop(request) and len(projected) == 2
    assert TEXT_KV not in condition
