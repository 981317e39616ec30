"""The golden cases: groups of requests per model, and the in-process driver that runs them.

A group's requests share every forward (a worker's step loop with all of them arriving at once):
alone groups hold one request, packed groups several of different sizes, steps and guidance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, Loop, ModelSpec, Node, RequestState

LATENTS, FRAMES = "latents", "frames"


@dataclass(frozen=True)
class Request:
    name: str
    params: GenerationParams
    image_seed: int | None = None  # an input_reference image of the request's size (image-to-video)


@dataclass(frozen=True)
class Group:
    spec_path: str
    requests: tuple[Request, ...]
    random_weights: bool = True
    config: dict[str, Any] = field(default_factory=dict)


def _wan(name: str, seed: int, guidance: float, size=(32, 32), frames=5, steps=3, image=None) -> Request:
    params = GenerationParams(
        prompt=f"a tiny fox, take {seed}", negative_prompt="blurry" if seed % 2 else None,
        width=size[0], height=size[1], num_frames=frames, num_inference_steps=steps,
        guidance_scale=guidance, seed=seed, has_input_reference=image is not None,
    )  # fmt: skip
    return Request(name, params, image)


def _zimage(name: str, seed: int, guidance: float, size=(32, 32), steps=3) -> Request:
    params = GenerationParams(
        prompt=f"a red kite, take {seed}", negative_prompt="dull" if seed % 2 else None,
        width=size[0], height=size[1], num_inference_steps=steps, guidance_scale=guidance, seed=seed,
    )  # fmt: skip
    return Request(name, params)


def _digits(name: str, prompt: str, seed: int, guidance: float, steps: int = 6) -> Request:
    params = GenerationParams(prompt=prompt, num_inference_steps=steps, guidance_scale=guidance, seed=seed)
    return Request(name, params)


WAN = "tests.serving.tiny_specs:TinyWanSpec"
ZIMAGE = "tests.serving.tiny_specs:ServedTinyZImageSpec"
DIGITS = "tiny-digits"

GROUPS: tuple[Group, ...] = (
    Group(WAN, (_wan("wan/t2v-guided-alone", 1, 5.0),)),
    Group(WAN, (_wan("wan/t2v-unguided-alone", 2, 1.0),)),
    Group(WAN, (_wan("wan/i2v-guided-alone", 3, 4.0, image=11),)),
    Group(WAN, (_wan("wan/i2v-unguided-alone", 4, 0.0, image=12),)),
    Group(
        WAN,
        (
            _wan("wan/packed-t2v-guided", 1, 5.0),
            _wan("wan/packed-i2v-guided", 5, 4.0, size=(48, 32), image=13),
            _wan("wan/packed-t2v-unguided", 6, 1.0, size=(32, 48), frames=9, steps=2),
            _wan("wan/packed-i2v-unguided", 7, 1.0, size=(32, 32), steps=4, image=14),
        ),
    ),
    Group(ZIMAGE, (_zimage("zimage/unguided-alone", 1, 0.0),)),
    Group(ZIMAGE, (_zimage("zimage/guided-alone", 2, 2.5),)),
    Group(
        ZIMAGE,
        (
            _zimage("zimage/packed-unguided", 1, 0.0),
            _zimage("zimage/packed-guided", 3, 2.5, size=(48, 32)),
            _zimage("zimage/packed-unguided-small", 4, 0.0, size=(16, 32), steps=2),
        ),
    ),
    Group(DIGITS, (_digits("digits/guided-alone", "a handwritten 7", 1, 3.5),), random_weights=False),
    Group(DIGITS, (_digits("digits/unguided-alone", "the digit three", 2, 1.0),), random_weights=False),
    Group(
        DIGITS,
        (
            _digits("digits/packed-guided", "a handwritten 7", 1, 3.5),
            _digits("digits/packed-unguided", "zero", 4, 0.0, steps=4),
            _digits("digits/packed-guided-other", "nine 9", 5, 2.0, steps=8),
        ),
        random_weights=False,
    ),
)


def _image(seed: int, width: int, height: int):
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def build_nodes(spec: ModelSpec, group: Group) -> dict[str, Node]:
    settings = {"compile_mode": "off", "warmup": False, "random_weights": group.random_weights}
    config = ServerConfig(**settings, **group.config)
    ctx = BuildContext(
        config=config, device="cpu", node_names=spec.node_names, random_weights=group.random_weights
    )
    return spec.build_nodes(ctx)


class Driver:
    """A worker's step loop in miniature, one process, no transport: rounds over the nodes in the
    spec's order, one forward per node for every request waiting there."""

    def __init__(self, spec: ModelSpec, nodes: dict[str, Node]):
        self.spec = spec
        self.nodes = nodes
        self.waiting: dict[str, list[RequestState]] = {name: [] for name in spec.node_names}
        self.position: dict[str, tuple[str, int]] = {}  # request_id -> (walk, stage index)
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, requests: list[RequestState]) -> dict[str, dict[str, Any]]:
        for request in requests:
            self.results[request.request_id] = {}
            self._begin(request, self.spec.first_walk(request.params))
        while any(self.waiting.values()):
            for name in self.spec.node_names:
                batch, self.waiting[name] = self.waiting[name], []
                if batch:
                    self._step(name, batch)
        return self.results

    def _step(self, name: str, batch: list[RequestState]) -> None:
        node = self.nodes[name]
        node.forward(batch)
        for request in batch:
            walk, index = self.position[request.request_id]
            if isinstance(self.spec.walks[walk].stages[index], Loop):
                if not node.check_stop(request):
                    self.waiting[name].append(request)
                    continue
                self.results[request.request_id][LATENTS] = request.tensors[LATENTS].clone()
            self._advance(request)

    def _begin(self, request: RequestState, walk: str) -> None:
        self.position[request.request_id] = (walk, 0)
        self._enter(request)

    def _enter(self, request: RequestState) -> None:
        walk, index = self.position[request.request_id]
        stage = self.spec.walks[walk].stages[index]
        name = stage.node if isinstance(stage, Loop) else stage
        assert isinstance(name, str), f"the golden driver runs no Parallel stages ({stage})"
        self.nodes[name].prepare(request)
        self.waiting[name].append(request)

    def _advance(self, request: RequestState) -> None:
        walk, index = self.position[request.request_id]
        if index + 1 < len(self.spec.walks[walk].stages):
            self.position[request.request_id] = (walk, index + 1)
            self._enter(request)
            return
        outputs = self.spec.walks[walk].outputs
        if outputs:
            request.tensors = {key: request.tensors[key] for key in outputs if key in request.tensors}
        following = self.spec.next_walk(request.params, walk)
        if following is not None:
            self._begin(request, following)
            return
        self.results[request.request_id][FRAMES] = request.tensors[FRAMES]
        for node in self.nodes.values():
            node.release(request)


def run_group(group: Group) -> dict[str, dict[str, Any]]:
    from mstar.models.registry import get_model_spec

    spec = get_model_spec(group.spec_path)
    nodes = build_nodes(spec, group)
    requests = []
    for item in group.requests:
        request = RequestState(item.name, spec.validate(item.params))
        if item.image_seed is not None:
            width, height = item.params.width, item.params.height
            request.tensors["input_reference"] = _image(item.image_seed, width, height)
        requests.append(request)
    return Driver(spec, nodes).run(requests)
