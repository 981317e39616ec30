"""Numpy-only models for live-server tests over the REAL Runtime (worker subprocesses resolve them as
"tests.api.live_models:LiveVideoSpec"). Limits and validation come from the fake specs; the nodes
denoise by counting steps and decode to the same seeded frames the fake runtime returns."""

from __future__ import annotations

import time
from typing import Any

import msgspec

from mstar.graph import BuildContext, Loop, Node, RequestState, Walk
from tests.api.fakes import FakeImageSpec, FakeVideoSpec, seeded_frames


class CountingDenoiser(Node):
    name = "dit"
    max_batch_size = 8

    def prepare(self, request: RequestState) -> None:
        request.state[self.name] = {"step": 0, "total": int(request.params.num_inference_steps)}

    def step_cost(self, request: RequestState) -> int:
        return request.params.width * request.params.height // 64

    def forward(self, batch: list[RequestState]) -> None:
        time.sleep(max(float(r.params.step_sleep_s) for r in batch))
        for request in batch:
            request.state[self.name]["step"] += 1

    def check_stop(self, request: RequestState) -> bool:
        state = request.state[self.name]
        return state["step"] >= state["total"]

    def progress(self, request: RequestState) -> tuple[int, int]:
        state = request.state[self.name]
        return state["step"], state["total"]


class FramesDecoder(Node):
    name = "decoder"
    max_batch_size = 8

    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            request.tensors["frames"] = seeded_frames(request.params)


class _LiveNodes:
    node_names = ("dit", "decoder")
    walks = {"generate": Walk("generate", (Loop("dit"), "decoder"), outputs=("frames",))}

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        nodes = {"dit": CountingDenoiser(), "decoder": FramesDecoder()}
        return {name: nodes[name] for name in ctx.node_names}


class LiveImageSpec(_LiveNodes, FakeImageSpec):
    name = "live-image"


class LiveVideoSpec(_LiveNodes, FakeVideoSpec):
    name = "live-video"

    def validate(self, params: Any) -> Any:
        # slow enough to observe in_progress and to cancel
        return msgspec.structs.replace(super().validate(params), step_sleep_s=0.05)


class SlowImageSpec(LiveImageSpec):
    """0.1 s a step and up to 400 steps: requests that are still in flight when the test acts."""

    name = "slow-image"
    max_steps = 400

    def validate(self, params: Any) -> Any:
        return msgspec.structs.replace(super().validate(params), step_sleep_s=0.1)


class SlowBootImageSpec(LiveImageSpec):
    """Builds its nodes for a minute: a server stopped while it boots."""

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        time.sleep(60)
        return super().build_nodes(ctx)


class BrokenBootImageSpec(LiveImageSpec):
    """Fails in build_nodes the way an unusable attention backend does."""

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        raise ValueError("attention backend 'fa3' cannot run on device 'cpu'")
