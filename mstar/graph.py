"""The vocabulary every layer shares: walks, request state, the node and model contracts.

Plain Python, no torch: the API process imports model specs from here without loading weights.
A model declares named walks; a walk is a sequence of stages; a stage is a node name, a
`Loop(node)` (the node runs once per step until its stop rule fires for that request) or a
`Parallel(nodes)`. The runtime executes walks; models never import the runtime.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mstar.params import LoraChoice, RequestParams

if TYPE_CHECKING:
    from mstar.adapters import LoraKeyRules


@dataclass(frozen=True)
class Loop:
    """Run `node` once per step for a request until `node.check_stop(request)` is true."""

    node: str


@dataclass(frozen=True)
class Parallel:
    """Run every node on the request; the stage ends when all of them are done."""

    nodes: tuple[str, ...]


Stage = str | Loop | Parallel


def stage_nodes(stage: Stage) -> tuple[str, ...]:
    if isinstance(stage, str):
        return (stage,)
    if isinstance(stage, Loop):
        return (stage.node,)
    return stage.nodes


@dataclass(frozen=True)
class Walk:
    """A named sequential path through nodes. `outputs` are the tensors kept when it ends."""

    name: str
    stages: tuple[Stage, ...]
    outputs: tuple[str, ...] = ()

    def nodes(self) -> tuple[str, ...]:
        return tuple(n for stage in self.stages for n in stage_nodes(stage))


@dataclass
class RequestState:
    """One request as a worker sees it. `tensors` holds its named tensors on this worker;
    `state` holds per-node scratch (sampler state, step index) keyed by node name. Both are
    dropped when the request ends for any reason."""

    request_id: str
    params: RequestParams  # the spec's params_type
    tensors: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    warmup: bool = False  # a boot warmup request (its steps stay out of /metrics)
    # Set by the runtime while the request is in the last stage of its final walk, else None:
    # `emit_output(key, piece)` sends a piece of output `key` (axis 0, in order) to the caller at
    # once, so it can start on it (the MP4 muxer takes a clip's frames while later chunks decode).
    # A key sent in pieces counts as produced and is not also put in `tensors`. A piece that is
    # a small JSON-able value (a dict of a text model's new tokens) travels inside the message.
    emit_output: Callable[[str, Any], None] | None = None


class Node:
    """One named component with its weights. The worker calls, per step:
    prepare (once per request on arrival), batch_key (requests sharing a key ride in one
    forward), forward (on a batch), then check_stop for Loop stages."""

    name: str = ""
    max_batch_size: int = 1

    def prepare(self, request: RequestState) -> None:
        """Cheap per-request set-up when the request arrives at this node."""

    def batch_key(self, request: RequestState) -> Hashable:
        return None

    def step_cost(self, request: RequestState) -> int:
        """What the request adds to one step (e.g. tokens); capped by max_step_cost."""
        return 1

    def ready(self, request: RequestState) -> bool:
        """Whether the request can ride the next forward (False: it waits in the queue, e.g. while
        its LoRA adapters load); raising fails the request alone."""
        return True

    max_step_cost: int | None = None

    def forward(self, batch: list[RequestState]) -> None:
        raise NotImplementedError

    def check_stop(self, request: RequestState) -> bool:
        return True

    def progress(self, request: RequestState) -> tuple[int, int] | None:
        """(steps done, steps total) for progress events, or None."""
        return None

    def release(self, request: RequestState) -> None:
        """Drop this node's per-request state (called on finish, failure and abort)."""
        request.state.pop(self.name, None)

    def warmup(self) -> None:
        """Compile and exercise configured sizes at boot (optional)."""

    def num_recompiles(self) -> int:
        """Compiles that happened after warmup (the worker reports increases to /metrics)."""
        return 0

    def event_counts(self) -> dict[str, int]:
        """Running totals of this node's events by name (e.g. prompt cache hits); the worker
        reports their increases to /metrics (`mstar:node_events_total`)."""
        return {}

    def gauges(self) -> dict[str, float]:
        """Current levels by name (e.g. the share of the KV pool in use); the worker reports
        them after a step when they changed."""
        return {}


@dataclass
class BuildContext:
    """What a model needs to build its nodes inside a worker process."""

    config: Any  # mstar.config.ServerConfig
    device: str
    node_names: tuple[str, ...]
    model_path: str | None = None
    random_weights: bool = False
    progress: Any = None  # callable(str, done, total) for load and warmup bars


@dataclass(frozen=True)
class GenerationParams:
    """Raw generation fields as users send them (None = use the model default)."""

    prompt: str
    negative_prompt: str | None = None
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    seconds: float | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    has_input_reference: bool = False
    lora: tuple[LoraChoice, ...] = ()  # the adapters the request names
    audio: bool | None = None  # a model with a soundtrack: decode it (None: the model's default)
    # (width, height) of each reference image of an edit (/v1/images/edits), in upload order.
    reference_sizes: tuple[tuple[int, int], ...] = ()


def reference_image_input(index: int) -> str:
    """The runtime input (and request tensor) holding an edit's reference image `index`, uint8 [H, W, 3]."""
    return f"reference_{index}"


# Labels: the streams of one request in a packed step (its conditioned pass, and the unconditioned
# one of classifier-free guidance); a family's geometry says which a request has.
COND, UNCOND = "cond", "uncond"

# The media a request ends in: what the API encodes the final walk's output as.
OutputKind = Literal["image", "video", "video+audio", "text"]


class ModelSpec(ABC):
    """A model as the runtime and API see it. Light: no torch at import; nodes are built by
    `build_nodes` inside the worker. `validate` raises mstar.errors.InvalidParam naming the field
    and returns the family's params (`params_type`, a frozen msgspec Struct: mstar.params)."""

    name: str
    task: str  # "text-to-image" | "text-to-video" | "image-to-video"
    output_kind: OutputKind
    params_type: type[RequestParams]
    walks: dict[str, Walk]
    node_names: tuple[str, ...]
    # The final walk leaves this tensor: uint8 frames [num_frames, height, width, 3].
    output_tensor: str = "frames"
    # Whether its text encoder can stream its weights from host memory (config offload_text_encoder)
    streams_text_encoder: bool = False
    # The family's LoRA key layouts (its lora_keys.py); None: requests name no adapters
    lora_keys: LoraKeyRules | None = None
    # A "video+audio" model's final walk also leaves this: float [channels, samples] in [-1, 1].
    audio_tensor: str = "audio"
    # How many reference images an edit may give (/v1/images/edits); 0: the model makes no edits.
    max_reference_images: int = 0
    # Media routes it serves besides its output kind's: "image" on a video model makes its
    # one-frame video, through /v1/images/generations (num_frames 1, its image defaults).
    extra_media_kinds: tuple[OutputKind, ...] = ()

    @abstractmethod
    def limits(self) -> dict[str, Any]:
        """Defaults and limits, shown in /v1/models."""

    @abstractmethod
    def validate(self, params: GenerationParams) -> RequestParams:
        """Resolve defaults and check limits; returns the family's params for the nodes."""

    @abstractmethod
    def first_walk(self, params: RequestParams) -> str: ...

    @abstractmethod
    def next_walk(self, params: RequestParams, finished: str) -> str | None:
        """The walk after `finished`, or None when the request is done."""

    @abstractmethod
    def build_nodes(self, ctx: BuildContext) -> dict[str, Node]: ...

    def warmup_requests(self, config: Any) -> list[RequestParams]:
        """Validated params the runtime sends through the whole walk at boot, before /ready, so no
        first request pays a first call (one per configured size); none by default."""
        return []

    def warmup_inputs(self, params: RequestParams) -> dict[str, Any]:
        """The input arrays a warmup request carries (an edit's reference images, uint8 numpy, as
        the API hands them over); none by default."""
        return {}

    def audio_sample_rate(self, params: RequestParams) -> int | None:
        """The sample rate of the request's audio track (`audio_tensor`), None when it has none."""
        return None

    def step_tokens(self, params: RequestParams) -> int | None:
        """The most a validated request can add to one denoise step (tokens times guidance labels),
        the unit of `max_tokens_per_step`; None when the model has no token-costed loop. The API
        refuses a request above the cap at validation: no step could ever hold it."""
        return None
