"""What a family registers for the benchmarks beside its spec (models/registry.py): one
BenchEntry subclass in models/<family>/bench.py (a DitBenchEntry for a diffusion family, a
TextBenchEntry for a text one), so `mstar bench step | diffusers | profile | llm` and the FLOP
counter serve a new family by its registering, with no branch of theirs naming it.

Torch-free at import: the entry's methods import torch, diffusers and the family's model files.
Items are the step benchmark's inputs: {"latents": [C, F, h, w], "timestep": float, "text": [S, D]},
one per segment of a packed forward; diffusers takes the same items as one batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mstar.models.flops import FlopCount
from mstar.models.geometry import Segment


@dataclass(frozen=True)
class StepWorkload:
    """One packed DiT forward: num_items segments of one size (2: a guidance pair; 8: 4 requests x 2)."""

    name: str
    width: int
    height: int
    num_frames: int  # 1 for images
    num_items: int
    tiny: bool = False  # CPU-sized, for the tiny configs


@dataclass(frozen=True)
class EndToEndWorkload:
    """One request through the whole pipeline (diffusers' baseline, and `mstar bench serve`)."""

    name: str
    kind: str  # "image" | "video"
    width: int
    height: int
    num_frames: int
    num_inference_steps: int
    guidance_scale: float
    tiny: bool = False

    def request_fields(self) -> dict[str, Any]:
        """The same workload as fields of an OpenAI-shaped request (for `mstar bench serve`)."""
        body: dict[str, Any] = {
            "num_inference_steps": self.num_inference_steps,
            "guidance_scale": self.guidance_scale,
        }
        if self.kind == "video":
            body["num_frames"] = self.num_frames
        return body


class BenchEntry:
    """What every benchmarked family registers: its label, its workloads and its full-size parity
    check. A text family's entry is a TextBenchEntry; a diffusion family's is a DitBenchEntry."""

    family: str  # the results' label
    step_workloads: tuple[StepWorkload, ...] = ()
    e2e_workloads: tuple[EndToEndWorkload, ...] = ()
    # The full-size parity check against diffusers ("module:function"), where the family has one.
    parity: str | None = None


class TextBenchEntry(BenchEntry, ABC):
    """A text family's: `mstar bench llm` serves one of its registered names with random weights
    and times the reference (transformers' batched generate) on the same seeded weights."""

    @abstractmethod
    def reference_model(self, model_config: Any, device: str, seed: int, dtype: Any) -> Any:
        """transformers' causal LM holding the weights the server builds from `model_config` with
        `seed` (--random-weights), parameters in `dtype` on `device`, EOS off (a fixed output length)."""


class DitBenchEntry(BenchEntry, ABC):
    """A DiT family's: the step benchmark (ours against diffusers' transformer, same weights), the
    FLOP counter and the end-to-end diffusers baseline drive it."""

    diffusers_transformer: str  # the diffusers class ours is timed and checked against

    @abstractmethod
    def transformer_config(self, tiny: bool) -> dict[str, Any]:
        """The transformer's diffusers config.json (the published checkpoint's, or the tiny one)."""

    @abstractmethod
    def segments(self, workload: StepWorkload) -> list[Segment]:
        """The workload's packed segments (from the family's geometry)."""

    @abstractmethod
    def count_flops(self, transformer_config: dict[str, Any], segments: list[Segment]) -> FlopCount:
        """FLOPs of one forward of the transformer over `segments`."""

    @abstractmethod
    def example_items(self, workload: StepWorkload, device: str, dtype: Any, seed: int) -> list[dict]:
        """Seeded inputs; the items of a guidance pair share latents and timestep, as in a real step."""

    @abstractmethod
    def diffusers_forward(self, model: Any, items: list[dict]) -> list[Any]:
        """One forward of diffusers' transformer over the items as a batch; one output per item."""

    @abstractmethod
    def make_ours(self, transformer_config: dict[str, Any]) -> Any:
        """Our eager DiT from the diffusers config (parameters on the current default device)."""

    @abstractmethod
    def optimize(self, model: Any, fuse: bool, kernels: bool) -> Any:
        """The family's optimize() transform (models/<family>/optimize.py)."""

    @abstractmethod
    def ours_forward(self, model: Any, attention: Any, keep_text: bool) -> Callable[[list[dict]], list[Any]]:
        """items -> outputs through our DiT; with `keep_text`, a text's text-only work (Wan's
        cross-attention keys/values, Z-Image's refined caption) runs once and is reused, as served."""

    @abstractmethod
    def diffusers_pipeline(self, workload: EndToEndWorkload, device: str, seed: int, dit_dtype: Any) -> Any:
        """diffusers' pipeline with seeded random weights and no text encoder (embeddings passed in)."""

    @abstractmethod
    def pipeline_inputs(
        self, workload: EndToEndWorkload, device: str, seed: int, dtype: Any
    ) -> dict[str, Any]:
        """Seeded stand-ins for the text encoders' outputs, and the family's own call arguments."""
