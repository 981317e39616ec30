"""Memory sizing: one step holds at most max_tokens_per_step tokens (x guidance labels).

The cap reaches every model's dit node; a request whose own step cost is above it is refused at
validation in the API process (400 naming size or num_frames), since no step could ever hold it;
each size limit alone (others at their defaults) fits under the default cap.
"""

from __future__ import annotations

import asyncio

import pytest

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams
from mstar.models.tiny_digits.model import TinyDigitsSpec
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.model import Wan22Spec
from mstar.models.zimage.config import TINY
from mstar.models.zimage.model import ZImageParams, ZImageSpec
from mstar.runtime.runtime import Runtime
from tests.api.conftest import build_client
from tests.serving.dit_nodes import build_dit, make_request

DEFAULT_CAP = ServerConfig().max_tokens_per_step


def tiny_digits_dit(**config):
    spec = TinyDigitsSpec()
    server = ServerConfig(compile_mode="off", warmup=False, **config)
    return spec, spec.build_nodes(BuildContext(config=server, device="cpu", node_names=("dit",)))["dit"]


def test_the_cap_reaches_every_models_dit_node():
    assert build_dit(Wan22Spec(tiny_wan22_config()), max_tokens_per_step=1234).max_step_cost == 1234
    assert build_dit(ZImageSpec(TINY), max_tokens_per_step=2345).max_step_cost == 2345
    assert tiny_digits_dit(max_tokens_per_step=3456)[1].max_step_cost == 3456


@pytest.mark.parametrize("guidance", [5.0, 1.0])
def test_wan_spec_tokens_are_the_nodes_step_cost(guidance):
    spec = Wan22Spec(tiny_wan22_config())
    node = build_dit(spec)
    fields = {"prompt": "p", "width": 96, "height": 64, "num_frames": 9, "guidance_scale": guidance}
    params = spec.validate(GenerationParams(**fields, seed=1))
    request = make_request("r", params, spec.config.dit.text_dim, 0)
    c = spec.config
    num_tokens = 3 * (64 // c.vae_scale_spatial // 2) * (96 // c.vae_scale_spatial // 2)  # 3 latent frames
    assert node.step_cost(request) == spec.step_tokens(params) == num_tokens * (2 if guidance > 1 else 1)


@pytest.mark.parametrize("guidance", [4.0, 0.0])
def test_zimage_spec_tokens_bound_the_nodes_step_cost(guidance):
    spec = ZImageSpec(TINY)
    node = build_dit(spec)
    params = {"prompt": "p", "negative_prompt": "", "width": 96, "height": 64, "seed": 1}
    params = ZImageParams(**params, num_inference_steps=2, guidance_scale=guidance)
    longest = make_request("r", params, TINY.dit.cap_feat_dim, 0)
    longest.tensors["prompt_embeds"] = longest.tensors["prompt_embeds"].new_zeros(
        TINY.max_sequence_length, TINY.dit.cap_feat_dim
    )  # [max caption tokens, D]: the bound the API uses
    assert node.step_cost(longest) == spec.step_tokens(params)
    short = make_request("s", params, TINY.dit.cap_feat_dim, 0)
    assert node.step_cost(short) < spec.step_tokens(params)


def test_zimage_step_cost_counts_a_long_negative_prompt():
    node = build_dit(ZImageSpec(TINY))
    params = {"prompt": "p", "negative_prompt": "n", "width": 96, "height": 64, "seed": 1}
    params = ZImageParams(**params, num_inference_steps=2, guidance_scale=4.0)
    request = make_request("r", params, TINY.dit.cap_feat_dim, 0)
    request.tensors["negative_prompt_embeds"] = request.tensors["prompt_embeds"].new_zeros(
        100, TINY.dit.cap_feat_dim
    )  # [100 caption tokens, D]: longer than the 7-token prompt
    num_image = (64 // 4) * (96 // 4)  # tiny VAE 2x, patch 2: 384 tokens, a multiple of 32
    sent = (num_image + 32) + (num_image + 128)  # each label: image + its caption padded to 32
    assert node.step_cost(request) >= sent


def test_tiny_digits_spec_tokens_are_the_nodes_step_cost():
    spec, node = tiny_digits_dit()
    for guidance in (3.5, 1.0):
        params = spec.validate(GenerationParams(prompt="seven", guidance_scale=guidance, seed=1))
        request = make_request("r", params, 32, 0)
        assert node.step_cost(request) == spec.step_tokens(params)


def test_a_request_above_the_cap_is_refused_at_the_node_too():
    spec = Wan22Spec(tiny_wan22_config())
    node = build_dit(spec, max_tokens_per_step=10)
    params = spec.validate(GenerationParams(prompt="p", width=96, height=64, num_frames=9, seed=1))
    with pytest.raises(ValueError, match="max_tokens_per_step=10"):
        node.prepare(make_request("r", params, spec.config.dit.text_dim, 0))


@pytest.mark.parametrize(
    "spec, field",
    [
        (Wan22Spec(), "width"), (Wan22Spec(), "height"), (Wan22Spec(), "num_frames"),
        (ZImageSpec(), "width"), (ZImageSpec(), "height"),
    ],
)  # fmt: skip
def test_each_size_limit_alone_fits_under_the_default_cap(spec, field):
    limits = spec.limits()
    fields = {"prompt": "p", field: limits[field]["max"]}
    if isinstance(spec, ZImageSpec):  # the pixel limit binds before the side limit
        other = "height" if field == "width" else "width"
        fields[other] = limits["pixels"]["max"] // limits[field]["max"]
    params = spec.validate(GenerationParams(**fields, guidance_scale=5.0))
    assert spec.step_tokens(params) <= DEFAULT_CAP


def post_video(client, **body):
    return client.post("/v1/videos", json={"model": "wan2.2-ti2v-5b", "prompt": "a fox", **body})


def test_a_video_above_the_cap_is_a_400_naming_num_frames_or_size():
    client, runtime = build_client(Wan22Spec(), max_tokens_per_step=60_000)
    with client:
        generator = client.app.state.mstar.generator  # validated only: encoding a 720p video is slow
        fields = {"prompt": "a fox", "width": 1280, "height": 704, "num_frames": 121}
        assert generator.validate(GenerationParams(**fields)).num_frames == 121  # 54560 tokens fit
        too_long = post_video(client, size="1280x704", num_frames=241)
        assert too_long.status_code == 400
        error = too_long.json()["error"]
        assert error["param"] == "num_frames" and "max_tokens_per_step" in error["message"]
        assert "60000" in error["message"]
        card = client.get("/v1/models").json()["data"][0]
        assert card["max_tokens_per_step"] == 60_000
    client, runtime = build_client(Wan22Spec(), max_tokens_per_step=3_000)
    with client:
        too_wide = post_video(client, size="1280x1280", num_frames=1)  # 40 x 40 x 2 = 3200 tokens
        assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "size"
    assert len(runtime.submitted) == 0  # nothing above the cap reached the runtime


def test_an_image_above_the_cap_is_a_400_naming_size():
    client, runtime = build_client(ZImageSpec(), max_tokens_per_step=4_000)
    with client:
        body = {"model": "z-image-turbo", "prompt": "a hill", "size": "1024x1024"}
        response = client.post("/v1/images/generations", json=body)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "size"
        body["size"] = "512x512"  # 1024 image + 512 caption tokens
        assert client.post("/v1/images/generations", json=body).status_code == 200
    assert len(runtime.submitted) == 1


def test_out_of_memory_failures_are_a_clear_503():
    client, runtime = build_client(ZImageSpec())
    runtime.fail_kind = "out_of_memory"
    with client:
        body = {"model": "z-image-turbo", "prompt": "a hill", "size": "512x512"}
        response = client.post("/v1/images/generations", json=body)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "out_of_memory" and "out of memory" in error["message"]
    assert "0xdeadbeef" not in error["message"]  # internal detail stays in the log


class StepRecorder:
    """MetricsSink keeping every step's (node, batch size, cost)."""

    def __init__(self):
        self.steps: list[tuple[str, int, int]] = []

    def observe_step(
        self, node: str, batch_size: int, cost: int, duration_s: float, host_duration_s: float = 0.0
    ) -> None:
        self.steps.append((node, batch_size, cost))

    def observe_queue_time(self, seconds: float) -> None: ...

    def observe_request_end(self, outcome: str, latency_s: float) -> None: ...

    def observe_walk(self, walk: str, seconds: float) -> None: ...

    def count_recompile(self, node: str, count: int) -> None: ...

    def count_node_events(self, node: str, increments: dict[str, int]) -> None: ...

    def observe_gpu_memory(self, worker: int, peak_allocated_bytes: int) -> None: ...


async def run_mix(runtime, many_params: list[dict]) -> list[dict]:
    await runtime.start()
    try:
        handles = [runtime.submit(params) for params in many_params]
        return await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60.0)
    finally:
        await runtime.shutdown(timeout_s=5.0)


def test_the_worker_step_never_exceeds_the_cap_with_a_mix():
    spec = TinyDigitsSpec()
    cap = 64  # two guided requests (32 tokens each), or one guided and two unguided (16 each)
    config = ServerConfig(model="tiny-digits", warmup=False, max_tokens_per_step=cap)
    recorder = StepRecorder()
    mix = [
        spec.validate(GenerationParams(prompt="seven", guidance_scale=g, seed=i, num_inference_steps=3))
        for i, g in enumerate([3.5, 1.0, 3.5, 3.5, 1.0, 3.5])
    ]
    outputs = asyncio.run(run_mix(Runtime(config, spec, recorder), mix))
    assert all(out["frames"].shape == (1, 256, 256, 3) for out in outputs)
    dit_steps = [(size, cost) for node, size, cost in recorder.steps if node == "dit"]
    assert max(cost for _, cost in dit_steps) <= cap, dit_steps
    assert max(size for size, _ in dit_steps) >= 2  # requests did share steps
    total_cost = sum(spec.step_tokens(p) for p in mix) * 3  # 3 steps each
    assert sum(cost for _, cost in dit_steps) == total_cost  # every step of every request ran, none lost
    assert len(dit_steps) >= total_cost / cap  # the rest waited for later steps
