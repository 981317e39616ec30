"""DenoiseNode: one packed predict per step, per-request samplers, guidance, stop rule."""

import torch

from mstar.diffusion.denoise import COND, UNCOND, DenoiseItem, DenoiseNode, DenoiseStart
from mstar.diffusion.noise import seeded_noise
from mstar.diffusion.samplers import FlowMatchEulerSampler, UniPCSampler
from mstar.graph import RequestState


class RecordingDenoiser:
    """Output depends on latents, timestep and text so guidance and stepping are observable."""

    def __init__(self):
        self.calls: list[list[DenoiseItem]] = []

    def predict(self, items):
        self.calls.append(items)
        return [torch.tanh(item.latents) * item.text + item.timestep / 1000 for item in items]


def _start(request: RequestState) -> DenoiseStart:
    params = request.params
    sampler_class = UniPCSampler if params["sampler"] == "unipc" else FlowMatchEulerSampler
    return DenoiseStart(
        latents=seeded_noise((2, 3, 4), params["seed"]),
        sampler=sampler_class(params["steps"], shift=3.0),
        num_tokens=6,
        guidance_scale=params["guidance"],
        use_guidance=params["guidance"] > 1,
    )


def _text(request: RequestState, label: str) -> torch.Tensor:
    return torch.tensor(2.0 if label == COND else -1.0)


def _request(request_id, steps, guidance, sampler="unipc", seed=0):
    params = {"steps": steps, "guidance": guidance, "sampler": sampler, "seed": seed}
    return RequestState(request_id, params)


def _reference_latents(params) -> torch.Tensor:
    """The same loop written out for one request."""
    start = _start(RequestState("ref", params))
    latents, sampler = start.latents, start.sampler
    while not sampler.done:
        t = float(sampler.timesteps[sampler.step_index])
        cond = torch.tanh(latents) * 2.0 + t / 1000
        if start.use_guidance:
            uncond = torch.tanh(latents) * -1.0 + t / 1000
            cond = uncond + start.guidance_scale * (cond - uncond)
        latents = sampler.step(cond, latents)
    return latents


def test_one_predict_per_step_for_all_requests_and_labels():
    denoiser = RecordingDenoiser()
    node = DenoiseNode("dit", denoiser, start=_start, text=_text)
    guided = _request("a", steps=3, guidance=5.0, seed=1)
    plain = _request("b", steps=2, guidance=1.0, sampler="euler", seed=2)
    for request in (guided, plain):
        node.prepare(request)
    assert node.step_cost(guided) == 12 and node.step_cost(plain) == 6
    assert node.batch_key(guided) == node.batch_key(plain)
    node.forward([guided, plain])
    assert len(denoiser.calls) == 1
    assert [(i.request_id, i.label) for i in denoiser.calls[0]] == [("a", COND), ("a", UNCOND), ("b", COND)]
    assert node.progress(guided) == (1, 3)
    node.forward([guided, plain])
    assert node.check_stop(plain) and not node.check_stop(guided)
    node.forward([guided])
    assert node.check_stop(guided)
    for request in (guided, plain):
        expected = _reference_latents(request.params)
        assert torch.allclose(request.tensors["latents"], expected, atol=1e-6, rtol=0)
    node.release(guided)
    assert "dit" not in guided.state


def test_batch_company_does_not_change_a_request():
    alone_node = DenoiseNode("dit", RecordingDenoiser(), start=_start, text=_text)
    alone = _request("a", steps=4, guidance=3.0, seed=5)
    while not alone_node.check_stop(alone):
        alone_node.forward([alone])
    shared_node = DenoiseNode("dit", RecordingDenoiser(), start=_start, text=_text)
    shared = _request("a", steps=4, guidance=3.0, seed=5)
    other = _request("c", steps=6, guidance=1.0, seed=9)
    while not shared_node.check_stop(shared):
        shared_node.forward([other, shared])
    assert torch.equal(alone.tensors["latents"], shared.tensors["latents"])


def test_finish_hook_and_custom_guidance():
    stored = {}

    def finish(request, latents):
        stored[request.request_id] = latents

    node = DenoiseNode(
        "dit",
        RecordingDenoiser(),
        start=_start,
        text=_text,
        finish=finish,
        combine_guidance=lambda cond, uncond, scale: cond + scale * (cond - uncond),
    )
    request = _request("z", steps=1, guidance=2.0, sampler="euler")
    node.forward([request])  # prepare happens on first use too
    assert "latents" not in request.tensors and stored["z"].shape == (2, 3, 4)


def test_a_bf16_denoiser_is_guided_and_stepped_in_bf16_as_the_pipeline_does():
    """WanPipeline combines bf16 outputs in bf16 and hands them to UniPC as they are."""
    import pytest

    diffusers = pytest.importorskip("diffusers")
    from tests.diffusion.test_samplers import WAN_UNIPC_CONFIG

    class Bf16Denoiser:
        def predict(self, items):
            return [(torch.tanh(i.latents) * i.text + i.timestep / 1000).to(torch.bfloat16) for i in items]

    node = DenoiseNode("dit", Bf16Denoiser(), start=_start, text=_text)
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
