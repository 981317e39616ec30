"""Every cross-process message of the runtime, as msgspec Structs (one tagged union, msgpack).

Tensor bytes never travel here: a `TensorRef` names a shared-memory segment (see shm.py).
Directions: C = conductor (API process), W = worker process.
`rid` is the runtime's own short request key (safe in file names); `request_id` is the caller's id.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from mstar.errors import FailureKind

CONDUCTOR = -1  # `next_worker` value: the walk's outputs go back to the conductor (final walk)


class TensorRef(msgspec.Struct, frozen=True):
    """One tensor in a shared-memory segment. `key` is its name in RequestState.tensors."""

    key: str
    segment: str  # file name inside the server's segment directory ("" when nbytes == 0)
    dtype: str  # numpy dtype name, or "bfloat16" (stored as 16-bit words)
    shape: tuple[int, ...]
    nbytes: int


class WorkerBoot(msgspec.Struct, frozen=True):
    """C -> W on stdin (JSON) at spawn: everything a worker needs to build its nodes."""

    config_json: str  # ServerConfig.model_dump_json()
    spec_path: str  # "module:Class" of the ModelSpec
    worker: int  # index into config.placement(...)
    incarnation: int
    bind_endpoint: str  # "ipc://..." or "tcp://127.0.0.1:*"
    conductor_endpoint: str
    segment_dir: str
    segment_prefix: str
    released: list[str] = []  # rids that ended while this worker was down: drop their messages


# ---- worker -> conductor -------------------------------------------------------------------


class Ready(msgspec.Struct, tag=True, frozen=True):
    worker: int
    incarnation: int
    endpoint: str  # where this worker receives messages


class BootFailed(msgspec.Struct, tag=True, frozen=True):
    worker: int
    incarnation: int
    error: str


class BootProgress(msgspec.Struct, tag=True, frozen=True):
    """Load and warmup progress while a worker boots (BuildContext.progress)."""

    worker: int
    label: str
    done: int
    total: int


class Heartbeat(msgspec.Struct, tag=True, frozen=True):
    worker: int
    incarnation: int
    num_requests: int  # requests whose state this worker holds
    gpu_peak_allocated_bytes: int = 0  # most bytes its tensors held on GPUs since the last heartbeat


class StepProgress(msgspec.Struct, tag=True, frozen=True):
    rid: str
    step: int
    total: int


class WalkDone(msgspec.Struct, tag=True, frozen=True):
    rid: str
    walk: str
    worker: int  # the worker that ran the walk's last stage
    outputs: list[TensorRef] = []  # only for the final walk (next_worker == CONDUCTOR)
    num_pieces: dict[str, int] = {}  # outputs sent ahead as OutputPiece messages: pieces per key


class OutputPiece(msgspec.Struct, tag=True, frozen=True):
    """A piece of a final output, sent while the walk's last stage still runs (a clip's frames as
    each chunk is decoded): the caller can start on it. Pieces of one key are in order along axis
    0 and come before the WalkDone that counts them (same worker, same connection)."""

    rid: str
    index: int  # 0, 1, ... per key
    piece: TensorRef


class InlinePiece(msgspec.Struct, tag=True, frozen=True):
    """A small JSON-able piece of a final output, carried in the message itself (a text model's
    tokens of one step): same order and count rules as OutputPiece, no shared-memory segment."""

    rid: str
    key: str
    index: int  # 0, 1, ... per key
    value: Any


class RequestError(msgspec.Struct, tag=True, frozen=True):
    rid: str
    message: str
    kind: FailureKind = "error"  # "worker_died" when a peer it needed is down


class StepStats(msgspec.Struct, tag=True, frozen=True):
    node: str
    batch_size: int
    cost: int
    duration_s: float  # device time (CUDA events) on GPU workers, host time on CPU workers
    host_duration_s: float = 0.0  # host time of the forward: queueing, plus any wait for the device
    warmup: bool = False  # every request of the batch was a boot warmup request (not in /metrics)


class Recompiles(msgspec.Struct, tag=True, frozen=True):
    node: str
    count: int


class NodeEvents(msgspec.Struct, tag=True, frozen=True):
    """Increases of a node's event counts (Node.event_counts) since the last report."""

    node: str
    increments: dict[str, int]
    gauges: dict[str, float] = {}  # the node's current levels (Node.gauges) when they changed


# ---- conductor -> worker -------------------------------------------------------------------


class RunWalk(msgspec.Struct, tag=True, frozen=True):
    """Start `walk` for a request at this worker (owner of the walk's first node)."""

    rid: str
    request_id: str
    params: msgspec.Raw  # the spec's params Struct, msgpack (mstar.params.encode_params)
    walk: str
    next_worker: int  # worker of the next walk's first node, or CONDUCTOR
    tensors: list[TensorRef] = []  # request inputs (first walk only)
    await_stash: bool = False  # the previous walk's outputs arrive from a peer as a Handoff "stash"
    warmup: bool = False  # a boot warmup request: its steps stay out of /metrics


class Release(msgspec.Struct, tag=True, frozen=True):
    """The request ended (done, failed, aborted, timed out): drop its state at the next step boundary."""

    rid: str


class Peers(msgspec.Struct, tag=True, frozen=True):
    endpoints: list[str]  # per worker index; "" while that worker is down
    version: int = 0  # the pool's count of broadcasts: PeersKnown answers with it


class PeersKnown(msgspec.Struct, tag=True, frozen=True):
    """A worker applied Peers `version`. Requests are admitted once every worker that is up has the
    newest table: a peer's handoff can overtake the conductor's broadcast (another connection)."""

    worker: int
    incarnation: int
    version: int


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    pass


# ---- worker -> worker ----------------------------------------------------------------------


HandoffPart = Literal["stage", "stash", "fork", "join"]


class Handoff(msgspec.Struct, tag=True, frozen=True):
    """A request's tensors moving between workers.

    part: "stage" (continue `walk` at `stage_index` here), "stash" (outputs of the previous walk,
    kept until RunWalk arrives), "fork" (run this worker's nodes of a Parallel stage, then send
    "join" back to `source`), "join" (a fork's results merged into the lead's tensors)."""

    part: HandoffPart
    rid: str
    request_id: str
    params: msgspec.Raw  # as RunWalk's
    walk: str
    stage_index: int
    next_worker: int
    source: int
    tensors: list[TensorRef] = []


Message = (
    Ready
    | BootFailed
    | BootProgress
    | Heartbeat
    | StepProgress
    | WalkDone
    | OutputPiece
    | InlinePiece
    | RequestError
    | StepStats
    | Recompiles
    | NodeEvents
    | RunWalk
    | Release
    | Peers
    | PeersKnown
    | Shutdown
    | Handoff
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)
