"""ZMQ control plane: PUSH/PULL sockets over ipc:// in a private 0700 directory, or loopback TCP.

Each process binds one PULL socket (its inbox) and keeps one PUSH socket per destination. Sends
never block: the high-water mark is off, and messages are small (tensors travel by shm.py). A ZMQ
message may carry several of ours, one per frame (StepOutbox): receivers decode every frame.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import zmq

from mstar.runtime import messages
from mstar.runtime.messages import Message


def make_run_dir() -> str:
    """A private directory for ipc sockets (and segments where /dev/shm is missing)."""
    path = tempfile.mkdtemp(prefix="mstar-")
    os.chmod(path, 0o700)
    return path


def bind_endpoint(transport: str, run_dir: str, name: str) -> str:
    """What to bind: a socket file in the run directory, or any free loopback port."""
    if transport == "ipc":
        return f"ipc://{os.path.join(run_dir, name)}.sock"
    return "tcp://127.0.0.1:*"


def bind_inbox(context: zmq.Context, endpoint: str) -> tuple[zmq.Socket, str]:
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVHWM, 0)
    socket.bind(endpoint)
    bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    if bound.startswith("ipc://"):
        os.chmod(bound[len("ipc://") :], 0o600)
    return socket, bound


def connect_push(context: zmq.Context, endpoint: str) -> zmq.Socket:
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, 0)
    socket.connect(endpoint)
    return socket


def send(socket: zmq.Socket, message: Message) -> None:
    socket.send(messages.encode(message), flags=zmq.NOBLOCK, copy=False)


def receive(socket: zmq.Socket, flags: int = 0) -> list[bytes]:
    """The encoded messages of the next ZMQ message (one per frame)."""
    return socket.recv_multipart(flags)


class StepOutbox:
    """Messages to one destination where a step sends many small ones (a text model's token pieces
    of every request, the step's stats): those of the `coalesced` types wait, and leave together as
    one ZMQ message of many frames at `flush`, which the sender calls at every step boundary and
    before it waits. Each send wakes ZMQ's I/O threads and the receiver, so a step of n requests
    costs one wake-up instead of n. Any other message flushes the waiting ones and leaves with them
    at once: the order is kept, and endings (WalkDone, errors) never wait. So does a coalesced one
    that `urgent` names (a request's first piece: its client is waiting for it)."""

    def __init__(
        self,
        socket: zmq.Socket,
        coalesced: tuple[type, ...],
        urgent: Callable[[Message], bool] = lambda message: False,
    ):
        self.socket = socket
        self.coalesced = coalesced
        self.urgent = urgent
        self._frames: list[bytes] = []

    def send(self, message: Message) -> None:
        self._frames.append(messages.encode(message))
        if not isinstance(message, self.coalesced) or self.urgent(message):
            self.flush()

    def flush(self) -> None:
        if self._frames:
            frames, self._frames = self._frames, []
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)

    @property
    def num_waiting(self) -> int:
        return len(self._frames)


class Outboxes:
    """PUSH sockets by destination index; re-connected when a destination's endpoint changes."""

    def __init__(self, context: zmq.Context):
        self._context = context
        self._sockets: dict[int, tuple[str, zmq.Socket]] = {}

    def set_endpoint(self, index: int, endpoint: str) -> None:
        current = self._sockets.get(index)
        if current is not None and current[0] == endpoint:
            return
        if current is not None:
            current[1].close(linger=0)  # messages queued for a dead incarnation are dropped
            del self._sockets[index]
        if endpoint:
            self._sockets[index] = (endpoint, connect_push(self._context, endpoint))

    def is_up(self, index: int) -> bool:
        return index in self._sockets

    def send(self, index: int, message: Message) -> bool:
        entry = self._sockets.get(index)
        if entry is None:
            return False
        send(entry[1], message)
        return True

    def close(self) -> None:
        for _, socket in self._sockets.values():
            socket.close(linger=0)
        self._sockets.clear()
