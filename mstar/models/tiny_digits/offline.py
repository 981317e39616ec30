"""Generate digits by calling the model's nodes in walk order, in this process (no server).

The model card, the sample sheet and the quality test use it; serving runs the same nodes through
the runtime. All requests ride in the same steps (one batch per node), as the worker would batch them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mstar.graph import BuildContext, GenerationParams, Loop, Node, RequestState, stage_nodes
from mstar.models.tiny_digits.config import WEIGHTS_DIR
from mstar.models.tiny_digits.model import TinyDigitsSpec


def build_local_nodes(device: str = "cpu", weights_dir: Path = WEIGHTS_DIR) -> dict[str, Node]:
    """Every node in this process on `device`, with the default config (auto attention and dtype)."""
    from mstar.config import ServerConfig
    from mstar.models.tiny_digits.nodes import build_nodes

    spec = TinyDigitsSpec()
    ctx = BuildContext(config=ServerConfig(device=device), device=device, node_names=spec.node_names)
    return build_nodes(ctx, weights_dir)


def generate(
    nodes: dict[str, Node], requests: list[GenerationParams], spec: TinyDigitsSpec | None = None
) -> list[np.ndarray]:
    """Frames uint8 [1, H, W, 3] per request, walking the spec's walks over `nodes`."""
    spec = spec or TinyDigitsSpec()
    states = [RequestState(f"offline-{i}", spec.validate(params)) for i, params in enumerate(requests)]
    walk = spec.first_walk(states[0].params)
    while walk is not None:
        for stage in spec.walks[walk].stages:
            (node_name,) = stage_nodes(stage)
            _run_stage(nodes[node_name], states, loop=isinstance(stage, Loop))
        walk = spec.next_walk(states[0].params, walk)
    return [np.asarray(state.tensors["frames"]) for state in states]


def _run_stage(node: Node, states: list[RequestState], loop: bool) -> None:
    for state in states:
        node.prepare(state)
    active = list(states)
    while active:
        node.forward(active)
        if not loop:
            break
        active = [state for state in active if not node.check_stop(state)]
    for state in states:
        node.release(state)
