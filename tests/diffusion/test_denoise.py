"""DenoiseNode driving a pipeline: one packed predict per step, per-request samplers, the family's
labels and guidance, the stop rule, finish, warmup. A recording pipeline stands in for a family's."""

import pytest
import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, DenoiseNode, DenoiseStart, cfg_combine
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, UniPCSampler
from mstar.graph import RequestState
from mstar.params import RequestParams

TEXTS = {COND: torch.tensor(2.0), UNCOND: torch.tensor(-1.0)}


class Params(RequestParams, kw_only=True):
    steps: int
    guidance: float
    sampler: str = "unipc"
    seed: int = 0


class RecordingPipeline:
    """Output depends on latents, timestep and text so guidance and stepping are observable."""

    def __init__(self, guide=cfg_combine):
        self.calls: list[list[DenoiseItem]] = []
        self.finished: dict[str, torch.Tensor] = {}
        self.combine = guide

    def prepare_latents(self, request: RequestState) -> DenoiseStart:
        params = request.params
        sampler_class = UniPCSampler if params.sampler == "unipc" else FlowMatchEulerSampler
        labels = (COND, UNCOND) if params.guidance > 1 else (COND,)
        return DenoiseStart(
            latents=seeded_noise((2, 3, 4), params.seed),
            sampler=sampler_class(params.steps, shift=3.0),
            num_tokens=6,
            texts={label: TEXTS[label] for label in labels},
            guidance_scale=params.guidance,
        )

    def predict(self, items):
        self.calls.append(items)
        return [torch.tanh(item.latents) * item.text + item.timestep / 1000 for item in items]

    def guide(self, outputs, guidance_scale):
        if UNCOND not in outputs:
            return outputs[COND]
        return self.combine(outputs[COND], outputs[UNCOND], guidance_scale)

    def step(self, state, guided):
        return state.sampler.step(guided, state.latents)

    def finish(self, request, state):
        self.finished[request.request_id] = state.latents
        request.tensors["latents"] = state.latents

    def warmup_item(self, size):
        return DenoiseItem("warmup", COND, torch.zeros(2, 3, 4), 999.0, 1.0, 0, TEXTS[COND], {})


def _request(request_id, steps, guidance, sampler="unipc", seed=0):
    return RequestState(request_id, Params(steps=steps, guidance=guidance, sampler=sampler, seed=seed))


def _reference_latents(params) -> torch.Tensor:
    """The same loop written out for one request."""
    start = RecordingPipeline().prepare_latents(RequestState("ref", params))
    latents, sampler = start.latents, start.sampler
    while not sampler.done:
        t = float(sampler.timesteps[sampler.step_index])
        cond = torch.tanh(latents) * 2.0 + t / 1000
        if UNCOND in start.texts:
            uncond = torch.tanh(latents) * -1.0 + t / 1000
            cond = uncond + start.guidance_scale * (cond - uncond)
        latents = sampler.step(cond, latents)
    return latents


def test_one_predict_per_step_for_all_requests_and_labels():
    pipeline = RecordingPipeline()
    node = DenoiseNode(pipeline)
    guided = _request("a", steps=3, guidance=5.0, seed=1)
    plain = _request("b", steps=2, guidance=1.0, sampler="euler", seed=2)
    for request in (guided, plain):
        node.prepare(request)
    assert node.step_cost(guided) == 12 and node.step_cost(plain) == 6
    assert node.batch_key(guided) == node.batch_key(plain)
    node.forward([guided, plain])
    assert len(pipeline.calls) == 1
    assert [(i.request_id, i.label) for i in pipeline.calls[0]] == [("a", COND), ("a", UNCOND), ("b", COND)]
    assert node.progress(guided) == (1, 3)
    node.forward([guided, plain])
    assert node.check_stop(plain) and not node.check_stop(guided)
    node.forward([guided])
    assert node.check_stop(guided)
    for request in (guided, plain):
        expected = _reference_latents(request.params)
        assert torch.allclose(request.tensors["latents"], expected, atol=1e-6, rtol=0)
    assert set(pipeline.finished) == {"a", "b"}
    node.release(guided)
    assert "dit" not in guided.state


def test_batch_company_does_not_change_a_request():
    alone_node = DenoiseNode(RecordingPipeline())
    alone = _request("a", steps=4, guidance=3.0, seed=5)
    while not alone_node.check_stop(alone):
        alone_node.forward([alone])
    shared_node = DenoiseNode(RecordingPipeline())
    shared = _request("a", steps=4, guidance=3.0, seed=5)
    other = _request("c", steps=6, guidance=1.0, seed=9)
    while not shared_node.check_stop(shared):
        shared_node.forward([other, shared])
    assert torch.equal(alone.tensors["latents"], shared.tensors["latents"])


def test_the_guidance_rule_is_the_pipelines():
    pipeline = RecordingPipeline(guide=lambda cond, uncond, scale: cond + scale * (cond - uncond))
    request = _request("z", steps=1, guidance=2.0, sampler="euler")
    DenoiseNode(pipeline).forward([request])  # prepare happens on first use too
    start = RecordingPipeline().prepare_latents(request)
    t = float(start.sampler.timesteps[0])
    cond = torch.tanh(start.latents) * 2.0 + t / 1000
    uncond = torch.tanh(start.latents) * -1.0 + t / 1000
    expected = start.sampler.step(cond + 2.0 * (cond - uncond), start.latents)
    assert torch.allclose(pipeline.finished["z"], expected, atol=1e-6, rtol=0)


def test_a_request_above_the_step_cap_fails_in_prepare():
    node = DenoiseNode(RecordingPipeline(), max_step_cost=10)
    with pytest.raises(ValueError, match="max_tokens_per_step=10"):
        node.prepare(_request("big", steps=1, guidance=5.0))  # 2 labels x 6 tokens


class Counting:
    def __init__(self):
        self.finished = False
        self.num_recompiles = 0

    def finish_warmup(self):
        self.finished = True


def test_warmup_runs_one_item_and_a_pair_per_size_then_marks_the_compiled_parts_warm():
    pipeline, compiled = RecordingPipeline(), Counting()
    node = DenoiseNode(pipeline, compiled=compiled, warmup_sizes=[None, "second size"])
    node.warmup()
    assert [len(call) for call in pipeline.calls] == [1, 2, 1, 2]
    assert compiled.finished and node.num_recompiles() == 0


class Bf16Pipeline(RecordingPipeline):
    """A bf16 DiT's outputs, guided by the pipeline's rule in their own dtype."""

    def predict(self, items):
        return [(torch.tanh(i.latents) * i.text + i.timestep / 1000).to(torch.bfloat16) for i in items]


def test_a_bf16_denoiser_is_guided_and_stepped_in_bf16_as_the_pipeline_does():
    """WanPipeline combines bf16 outputs in bf16 and hands them to UniPC as they are."""
    diffusers = pytest.importorskip("diffusers")
    from tests.diffusion.test_samplers import WAN_UNIPC_CONFIG

    node = DenoiseNode(Bf16Pipeline())
    request = _request("a", steps=4, guidance=5.0, seed=3)
    node.prepare(request)
    while not node.check_stop(request):
        node.forward([request])

    scheduler = diffusers.UniPCMultistepScheduler.from_config(dict(WAN_UNIPC_CONFIG, flow_shift=3.0))
    scheduler.set_timesteps(4)
    latents = seeded_noise((2, 3, 4), 3)
    for t in scheduler.timesteps:
        cond = (torch.tanh(latents) * 2.0 + float(t) / 1000).to(torch.bfloat16)
        uncond = (torch.tanh(latents) * -1.0 + float(t) / 1000).to(torch.bfloat16)
        guided = uncond + 5.0 * (cond - uncond)  # bf16, as the pipeline computes it
        latents = scheduler.step(guided, t, latents, return_dict=False)[0]
    assert torch.equal(request.tensors["latents"], latents)


def test_wans_guidance_keeps_the_dits_dtype():
    from mstar.models.wan22.config import tiny_wan22_config
    from mstar.models.wan22.pipeline import WanPipeline

    cond, uncond = torch.randn(4).bfloat16(), torch.randn(4).bfloat16()
    guided = WanPipeline(tiny_wan22_config(), "cpu", torch.bfloat16).guide({COND: cond, UNCOND: uncond}, 5.0)
    assert guided.dtype == torch.bfloat16 and torch.equal(guided, uncond + 5.0 * (cond - uncond))
