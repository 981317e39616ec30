"""Cross-attention text keys/values computed once (WanDiT.text_kv) and reused: byte-identical outputs
to computing them in every forward, per item alone, and cached per (request, label) by the denoiser
(tiny config, fp32, CPU)."""

import copy

import pytest
import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseNode
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.graph import RequestState
from mstar.models.text_encoding import NEGATIVE_PROMPT_EMBEDS, PROMPT_EMBEDS
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT
from mstar.models.wan22.model import WanParams
from mstar.models.wan22.optimize import optimize
from mstar.models.wan22.pipeline import TEXT_KV, WanPipeline


@pytest.fixture(scope="module", params=[False, True], ids=["unfused", "fused"])
def dit(request):
    torch.manual_seed(0)
    model = WanDiT(tiny_wan22_config().dit).eval()
    return optimize(model, fuse=True, kernels=False) if request.param else model


def _attention():
    return build_attention("torch", "cpu", torch.float32)


def _items(seed: int = 1) -> list[DiTInput]:
    """Items of different sizes, timesteps and text lengths (two share a timestep: a guidance pair).
    Token counts avoid a few odd small ones (1, 2, 6, 9): CPU BLAS then picks other kernels for an
    item's token GEMMs alone than packed, ~2e-7 apart; that is the tokens' GEMMs, not the text's."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(2, 8, 8, 16, 900.0), (2, 8, 8, 16, 900.0), (3, 6, 10, 9, 300.0), (1, 4, 8, 5, 10.0)]
    items = []
    for frames, height, width, text_len, timestep in shapes:
        latents = torch.randn(16, frames, height, width, generator=generator)
        items.append(DiTInput(latents, timestep, torch.randn(text_len, 16, generator=generator)))
    return items


def _with_text_kv(dit: WanDiT, items: list[DiTInput]) -> list[DiTInput]:
    return [DiTInput(i.latents, i.timestep, None, i.num_clean_frames, dit.text_kv(i.text)) for i in items]


def _assert_all_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for index, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"item {index}: max difference {float((a - b).abs().max()):.3g}"


def test_text_kv_is_each_layers_normalised_keys_and_values(dit):
    text = torch.randn(7, 16)
    with torch.no_grad():
        text_kv = dit.text_kv(text)
        context = dit.condition_embedder.text_embedder(text)
        config = dit.config
        assert text_kv.shape == (config.num_layers, 2, 7, config.inner_dim)
        assert text_kv.dtype == dit.dtype
        for index, block in enumerate(dit.blocks):
            attn = block.attn2
            if hasattr(attn, "to_kv"):
                key, value = attn.to_kv(context).chunk(2, dim=-1)
            else:
                key, value = attn.to_k(context), attn.to_v(context)
            assert torch.equal(text_kv[index, 0], attn.norm_k(key))
            assert torch.equal(text_kv[index, 1], value)


def test_precomputed_text_kv_equals_text_and_packed_equals_alone(dit):
    items = _items()
    with torch.no_grad():
        from_text = dit(items, _attention())
        cached = _with_text_kv(dit, items)
        from_cache = dit(cached, _attention())
        alone = [dit([item], _attention())[0] for item in cached]
    _assert_all_equal(from_cache, from_text)
    _assert_all_equal(from_cache, alone)  # an item's output does not depend on its company
    assert not torch.equal(from_cache[0], from_cache[1])  # same latents, other text: the text matters


def test_mixed_items_with_and_without_text_kv(dit):
    items = _items(seed=2)
    mixed = [item if index % 2 else _with_text_kv(dit, [item])[0] for index, item in enumerate(items)]
    with torch.no_grad():
        _assert_all_equal(dit(mixed, _attention()), dit(items, _attention()))


def test_bad_text_kv_is_rejected(dit):
    item = _items()[0]
    with pytest.raises(ValueError, match="text_kv must be"):
        dit([DiTInput(item.latents, item.timestep, text_kv=torch.zeros(1, 2, 4, 3))], _attention())
    with pytest.raises(ValueError, match="text or text_kv"):
        dit([DiTInput(item.latents, item.timestep)], _attention())


def test_gradients_reach_the_text_projections_through_text_kv(dit):
    from mstar.models.tiny_digits.train import TrainingAttention  # autograd-friendly attention

    model = copy.deepcopy(dit).train()
    (out,) = model(_items()[2:3], TrainingAttention())
    out.square().mean().backward()
    attn = model.blocks[0].attn2
    projection = getattr(attn, "to_kv", None) or attn.to_k
    assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0
    assert model.condition_embedder.text_embedder.linear_1.weight.grad.abs().sum() > 0


class _UncachedPipeline(WanPipeline):
    """The reference: the text goes to the DiT at every step (its keys/values computed each time)."""

    def predict(self, items):
        for item in items:
            item.condition.pop(TEXT_KV, None)
        inputs = [DiTInput(item.latents, item.timestep, item.text) for item in items]
        return self.dit(inputs, self.attention)


def _requests() -> list[RequestState]:
    generator = torch.Generator().manual_seed(3)
    fields = [
        {"width": 32, "height": 32, "num_frames": 5, "guidance_scale": 5.0, "seed": 1},
        {"width": 48, "height": 32, "num_frames": 9, "guidance_scale": 1.0, "seed": 2},
        {"width": 32, "height": 48, "num_frames": 5, "guidance_scale": 3.0, "seed": 3},
    ]
    requests = []
    for index, params in enumerate(fields):
        request = RequestState(f"r{index}", WanParams(prompt="p", fps=8, num_inference_steps=4, **params))
        request.tensors[PROMPT_EMBEDS] = torch.randn(5 + index, 16, generator=generator)
        request.tensors[NEGATIVE_PROMPT_EMBEDS] = torch.randn(3, 16, generator=generator)
        requests.append(request)
    return requests


def _denoise(node: DenoiseNode, requests: list[RequestState]) -> list[dict]:
    """Every request through the loop together; the condition dicts as they were mid-loop."""
    conditions = []
    while not all(node.check_stop(request) for request in requests):
        node.forward([request for request in requests if not node.check_stop(request)])
        conditions = conditions or [_snapshot(request.state[node.name].condition) for request in requests]
    return conditions


def _snapshot(condition: dict) -> dict:
    """The condition and the dicts in it, copied (the node empties the kept ones in place)."""
    return {key: dict(value) if isinstance(value, dict) else value for key, value in condition.items()}


def test_denoiser_caches_text_kv_per_request_and_label(dit):
    config = tiny_wan22_config()
    calls = []

    def counting_text_kv(text):
        calls.append(text.shape[0])
        return WanDiT.text_kv(dit, text)

    reference = _requests()
    _denoise(
        DenoiseNode(_UncachedPipeline(config, "cpu", torch.float32, dit=dit, attention=_attention())),
        reference,
    )
    cached_node = DenoiseNode(WanPipeline(config, "cpu", torch.float32, dit=dit, attention=_attention()))
    cached = _requests()
    dit.text_kv = counting_text_kv  # an instance attribute over the method: counts the calls
    try:
        conditions = _denoise(cached_node, cached)
    finally:
        del dit.text_kv
    # Three requests, two with guidance: five (request, label) texts over four steps, each computed once.
    assert calls == [config.max_text_tokens] * 5
    assert [sorted(condition[TEXT_KV]) for condition in conditions] == [
        [COND, UNCOND],
        [COND],
        [COND, UNCOND],
    ]
    for got, want in zip(cached, reference, strict=True):
        assert torch.equal(got.tensors["latents"], want.tensors["latents"])
        # The loop is over: the keys/values are freed at once, and release drops the whole state.
        assert TEXT_KV not in got.state[cached_node.name].condition
        cached_node.release(got)
        assert cached_node.name not in got.state


@pytest.mark.gpu
def test_compiled_layers_take_text_kv_in_one_graph_on_cuda():
    """bf16 on CUDA, the server's compile path: new pack and text lengths compile nothing after the
    first call, and the compiled stack over cached keys/values matches the eager one."""
    device, dtype = "cuda", torch.bfloat16
    torch.manual_seed(0)
    import dataclasses

    # head_dim 16: CUDA's varlen attention takes head sizes in multiples of 8 (the tiny config has 12)
    config = dataclasses.replace(tiny_wan22_config().dit, attention_head_dim=16)
    eager = optimize(WanDiT(config).to(device, dtype).eval(), fuse=True, kernels=False)
    compiled = copy.deepcopy(eager)
    parts = compile_methods(compiled, WanDiT.compiled_methods, "deterministic", "wan.dit", duck_shapes=False)
    attention = build_attention("torch", device, dtype)
    generator = torch.Generator().manual_seed(4)
    # Two items per call (one modulation row would specialise); text lengths avoid 24 (the width).
    for sizes in (
        [(2, 8, 8, 16), (1, 4, 8, 9)],
        [(1, 6, 6, 5), (3, 8, 10, 16)],
        [(2, 4, 4, 7), (2, 4, 4, 11)],
    ):
        items = []
        for frames, height, width, text_len in sizes:
            latents = torch.randn(16, frames, height, width, generator=generator).to(device)
            text = torch.randn(text_len, 16, generator=generator).to(device, dtype)
            items.append(DiTInput(latents, 500.0, text_kv=eager.text_kv(text)))
        with torch.inference_mode():
            for got, want in zip(compiled(items, attention), eager(items, attention), strict=True):
                assert float((got.float() - want.float()).norm() / want.float().norm()) < 2e-2
        parts.finish_warmup()  # after the first call: every later one must reuse its graph
    assert parts.num_recompiles == 0
