"""Pieces of a request's final outputs, sent to the conductor while the walk's last stage runs.

A node in the last stage of a request's final walk gets `RequestState.emit_output`; each call
writes one piece to shared memory and sends an OutputPiece at once, so the caller can start on
it (the MP4 muxer takes a clip's first frames while the VAE still decodes the rest). WalkDone
then counts the pieces per key, and the conductor checks the count before it finishes the request.
A piece that is a small JSON-able value (dict, list or str: a text model's tokens of one step)
travels inside an InlinePiece message instead of a segment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mstar.runtime import messages as m
from mstar.runtime.requests import WorkerRequest
from mstar.runtime.shm import SegmentStore
from mstar.runtime.tensors import to_numpy


class PieceSender:
    """The `emit_output` of one request in the last stage of its final walk."""

    def __init__(self, store: SegmentStore, send: Callable[[m.Message], None], rid: str):
        self.store = store
        self.send = send
        self.rid = rid
        self.num_pieces: dict[str, int] = {}  # pieces sent per output key

    def __call__(self, key: str, piece: Any) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"emit_output needs an output name, got {key!r}")
        if isinstance(piece, dict | list | str):  # JSON-able, small: inline, no segment
            self._send_inline(key, piece)
            return
        array, dtype_name = to_numpy(piece)  # a device tensor: copied here, after the work queued before it
        if array.ndim == 0:
            raise ValueError(f"output '{key}': a piece needs an axis 0 to join along, got a scalar")
        ref = self.store.write(self.rid, key, array, dtype_name)
        index = self.num_pieces.get(key, 0)
        self.send(m.OutputPiece(self.rid, index, ref))
        self.num_pieces[key] = index + 1

    def _send_inline(self, key: str, value: Any) -> None:
        index = self.num_pieces.get(key, 0)
        self.send(m.InlinePiece(self.rid, key, index, value))
        self.num_pieces[key] = index + 1


def piece_sender(
    request: WorkerRequest, num_stages: int, store: SegmentStore, send: Callable[[m.Message], None]
) -> PieceSender | None:
    """The `emit_output` of a WorkerRequest entering a stage: a sender in the last stage of its
    final walk, else None. Only there do the pieces and the WalkDone that counts them leave from
    one worker on one connection, in order."""
    if request.next_worker != m.CONDUCTOR or request.stage_index != num_stages - 1:
        return None
    return PieceSender(store, send, request.rid)


def num_pieces_sent(emit_output: Any) -> dict[str, int]:
    """Pieces per key that a request's `emit_output` sent ({} when it had none)."""
    return dict(emit_output.num_pieces) if isinstance(emit_output, PieceSender) else {}
