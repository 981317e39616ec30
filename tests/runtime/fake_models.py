"""Fake models for runtime tests: numpy-only nodes (fast worker start, no torch), resolved by the
worker subprocess as "tests.runtime.fake_models:FakeSpec".

Walks: "encode" = Parallel(encoder, aux) -> "generate" = Loop(denoiser), decoder.
With no input image the final frames value is 4 * seed + steps (mod 256); `num_frames` frames
count up from it. Where the runtime takes pieces, the decoder sends them a frame at a time.
Per-request knobs in params: seed, steps, key (denoiser batch key), cost, step_sleep_s,
fail ("encoder.prepare", "denoiser.forward", "denoiser.stop", "decoder.mid_clip"), release_log (a file path),
recompile (each denoise step of the request counts as a recompile).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from mstar.graph import BuildContext, Loop, ModelSpec, Node, Parallel, RequestState, Walk
from mstar.params import RequestParams

SPEC_PATH = "tests.runtime.fake_models:FakeSpec"


class FakeParams(RequestParams, kw_only=True):
    """The per-request knobs of the module docstring."""

    seed: int = 0
    steps: int = 3
    key: str = "shared"
    cost: int = 1
    step_sleep_s: float = 0.0
    num_frames: int = 1
    fail: str | None = None
    release_log: str | None = None
    recompile: bool = False
    oom: bool = False


def _log_release(node: Node, request: RequestState) -> None:
    path = request.params.release_log
    if path:
        with open(path, "a") as log_file:
            log_file.write(f"{os.getpid()} {node.name} {request.request_id}\n")


class LoggingNode(Node):
    def release(self, request: RequestState) -> None:
        _log_release(self, request)
        super().release(request)


class EncoderNode(LoggingNode):
    name = "encoder"
    max_batch_size = 8

    def prepare(self, request: RequestState) -> None:
        if request.params.fail == "encoder.prepare":
            raise ValueError("bad prompt")

    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            image = request.tensors.get("image")
            extra = float(image.sum()) if image is not None else 0.0
            request.tensors["embeds"] = np.full(4, request.params.seed + extra, dtype=np.float32)


class AuxNode(LoggingNode):
    name = "aux"
    max_batch_size = 8

    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            request.tensors["aux"] = np.arange(3, dtype=np.float32) * request.params.seed


class DenoiserNode(LoggingNode):
    name = "denoiser"
    max_batch_size = 4
    max_step_cost = 8

    def __init__(self):
        self._num_recompiles = 0

    def num_recompiles(self) -> int:
        return self._num_recompiles

    def prepare(self, request: RequestState) -> None:
        steps = request.params.steps
        request.state[self.name] = {"step": 0, "total": steps, "batch_sizes": []}
        request.tensors["latents"] = request.tensors["embeds"] + request.tensors["aux"].sum()

    def batch_key(self, request: RequestState) -> Any:
        return request.params.key

    def step_cost(self, request: RequestState) -> int:
        return int(request.params.cost)

    def forward(self, batch: list[RequestState]) -> None:
        if any(r.params.fail == "denoiser.forward" for r in batch):
            raise RuntimeError("kernel exploded")
        time.sleep(max(float(r.params.step_sleep_s) for r in batch))
        self._num_recompiles += sum(1 for r in batch if r.params.recompile)
        for request in batch:
            state = request.state[self.name]
            state["step"] += 1
            state["batch_sizes"].append(len(batch))
            request.tensors["latents"] = request.tensors["latents"] + 1
            request.tensors["batch_sizes"] = np.array(state["batch_sizes"], dtype=np.int64)

    def check_stop(self, request: RequestState) -> bool:
        state = request.state[self.name]
        if request.params.fail == "denoiser.stop" and state["step"] == 2:
            raise ValueError("stop rule broke")
        return state["step"] >= state["total"]

    def progress(self, request: RequestState) -> tuple[int, int]:
        state = request.state[self.name]
        return state["step"], state["total"]


class DecoderNode(LoggingNode):
    name = "decoder"
    max_batch_size = 8

    def forward(self, batch: list[RequestState]) -> None:
        for request in batch:
            value = int(request.tensors["latents"].mean()) % 256
            num_frames = int(request.params.num_frames)
            frames = np.stack(
                [np.full((2, 2, 3), (value + i) % 256, dtype=np.uint8) for i in range(num_frames)]
            )
            if request.emit_output is None:
                request.tensors["frames"] = frames
                continue
            for index, frame in enumerate(frames):  # a frame at a time, as a clip's VAE chunks
                if index == 1 and request.params.fail == "decoder.mid_clip":
                    raise RuntimeError("decoder broke after the first piece")
                request.emit_output("frames", frame[None])


NODE_CLASSES = {cls.name: cls for cls in (EncoderNode, AuxNode, DenoiserNode, DecoderNode)}


class FakeSpec(ModelSpec):
    name = "fake"
    task = "text-to-image"
    output_kind = "image"
    params_type = FakeParams
    node_names = ("encoder", "aux", "denoiser", "decoder")
    walks = {
        "encode": Walk("encode", (Parallel(("encoder", "aux")),), outputs=("embeds", "aux")),
        "generate": Walk("generate", (Loop("denoiser"), "decoder"), outputs=("frames", "batch_sizes")),
    }

    def limits(self) -> dict[str, Any]:
        return {}

    def validate(self, params: Any) -> FakeParams:
        return FakeParams(seed=params.seed or 0)

    def first_walk(self, params: FakeParams) -> str:
        return "encode"

    def next_walk(self, params: FakeParams, finished: str) -> str | None:
        return "generate" if finished == "encode" else None

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        nodes = {}
        for index, name in enumerate(ctx.node_names):
            nodes[name] = NODE_CLASSES[name]()
            ctx.progress("build", index + 1, len(ctx.node_names))
        return nodes


class BrokenBootSpec(FakeSpec):
    """Fails in build_nodes the way an unusable attention backend does."""

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        raise ValueError("attention backend 'fa3' cannot run on device 'cpu'")


def expected_frame_value(seed: int, steps: int) -> int:
    return (4 * seed + steps) % 256


class TorchNode(Node):
    """Torch-holding nodes (torch imported in the worker only when they are built)."""

    def __init__(self, name: str, device: str):
        self.name = name
        self.device = device
        self.max_batch_size = 4

    def forward(self, batch: list[RequestState]) -> None:
        import torch

        for request in batch:
            if self.name == "make":  # bf16 [2, 3] on the node's device
                values = torch.arange(6, dtype=torch.float32).reshape(2, 3) * request.params.seed
                request.tensors["x"] = values.to(device=self.device, dtype=torch.bfloat16)
            elif self.name == "scale":
                x = request.tensors["x"].to(self.device)  # arrives on CPU from another worker
                assert x.dtype == torch.bfloat16, x.dtype
                request.tensors["x"] = x * 2
                request.state["scale"] = request.state.get("scale", 0) + 1
            else:
                x = request.tensors["x"].to(self.device)
                request.tensors["frames"] = x.float().clamp(0, 255).to(torch.uint8).reshape(1, 2, 3, 1)

    def check_stop(self, request: RequestState) -> bool:
        return request.state.get("scale", 0) >= request.params.steps


class TorchSpec(FakeSpec):
    """make -> Loop(scale) -> finish; bf16 tensors cross workers and reach the API as float32."""

    node_names = ("make", "scale", "finish")
    walks = {"run": Walk("run", ("make", Loop("scale"), "finish"), outputs=("frames", "x"))}

    def first_walk(self, params: FakeParams) -> str:
        return "run"

    def next_walk(self, params: FakeParams, finished: str) -> str | None:
        return None

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        return {name: TorchNode(name, ctx.device) for name in ctx.node_names}


class WarmupSpec(FakeSpec):
    """Sends one request through the whole walk at boot, before the runtime is ready."""

    def warmup_requests(self, config: Any) -> list[FakeParams]:
        return [FakeParams(seed=7, steps=2, release_log=config.api_key)]  # api_key: the test's log path


class BrokenWarmupSpec(FakeSpec):
    def warmup_requests(self, config: Any) -> list[FakeParams]:
        return [FakeParams(seed=7, fail="denoiser.forward")]
