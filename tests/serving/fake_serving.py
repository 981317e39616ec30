"""A fake model for serving-robustness tests, resolved by the worker as SPEC_PATH.

The fake runtime models' nodes (numpy), with a denoiser that, per request params from `validate`:
raises torch.cuda.OutOfMemoryError when "oom" (seed 13; its own batch key, so it rides alone), and
counts a recompile per step when "recompile" (odd seeds), as a compiled DiT does after warmup.
"""

from __future__ import annotations

from mstar.graph import BuildContext, GenerationParams, Node, RequestState
from tests.runtime.fake_models import NODE_CLASSES, DenoiserNode, FakeParams, FakeSpec

SPEC_PATH = f"{__name__}:ServingSpec"
OOM_SEED = 13


class OutOfMemoryDenoiser(DenoiserNode):
    def forward(self, batch: list[RequestState]) -> None:
        if any(r.params.oom for r in batch):
            import torch

            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        super().forward(batch)


class ServingSpec(FakeSpec):
    name = "serving-fake"

    def validate(self, params: GenerationParams) -> FakeParams:
        seed = params.seed or 0
        oom = seed == OOM_SEED
        return FakeParams(seed=seed, steps=2, oom=oom, recompile=seed % 2 == 1, key="oom" if oom else "ok")

    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]:
        classes = {**NODE_CLASSES, "denoiser": OutOfMemoryDenoiser}
        return {name: classes[name]() for name in ctx.node_names}
