"""The device LRU of LoRA adapters: `num_slots` resident in the wrapped layers' slot buffers.

A request names its adapters when it arrives (`acquire`); files are read, converted and packed
on a loader thread (off the step loop), then copied into slots on the step thread (`poll`, at a
step boundary, queued on the stream the steps run on, so a slot is rewritten only after the steps
that read it). A request is ready once all its adapters are resident; until then it waits outside
the step. Requests get their slots in arrival order: the oldest waiting one may evict any adapter
that no ready request uses, so requests cannot hold slots against each other. A file that cannot
be loaded fails the requests that name it, with the reason, and nothing else; the failure is kept
for that version of the file (a replaced file is read again).

Adapters are keyed by file version (path, mtime, size): a file replaced while the server runs is
a new adapter for requests that arrive after.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mstar.adapters import AdapterFileError, LoraCatalog, LoraKeyRules
from mstar.engine.lora.weights import load_adapter
from mstar.engine.lora.wrap import LoraLayers
from mstar.params import LoraChoice

logger = logging.getLogger("mstar.engine.lora")

Version = tuple[str, int, int]
_stores: weakref.WeakSet[AdapterStore] = weakref.WeakSet()


def resident_adapter_names() -> list[str]:
    """Names of the adapters resident in this process's stores (for /v1/loras' `loaded`)."""
    return sorted({name for store in list(_stores) for name in store.resident_names()})


@dataclass
class _Adapter:
    name: str
    version: Version
    status: str = "loading"  # loading -> staged -> resident; or failed
    packed: list[torch.Tensor] | None = None  # host contents while staged (and until copied)
    slot: int = 0
    error: str = ""
    load_s: float = 0.0


@dataclass
class _Request:
    adapters: list[tuple[_Adapter, float]]
    ready: bool = False
    error: str = ""
    order: int = 0


@dataclass
class _Copy:
    packed: list[torch.Tensor]
    event: object = None  # torch.cuda.Event on CUDA


@dataclass
class LoraStatus:
    """A request's adapters: ready (resident), waiting (loading or for a slot), or failed."""

    ready: bool
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error)


@dataclass
class StoreStats:
    loads: int = 0
    evictions: int = 0
    failures: int = 0
    load_s: list[float] = field(default_factory=list)  # per load: read, convert and pack


class AdapterStore:
    def __init__(
        self,
        catalog: LoraCatalog,
        layers: LoraLayers,
        rules: LoraKeyRules,
        on_loaded: Callable[[], None] | None = None,
    ):
        self.catalog = catalog
        self.layers = layers
        self.rules = rules
        self.on_loaded = on_loaded  # called on the loader thread when a load ends (wake the loop)
        self.device = layers.layers[0].lora_a.device if layers.layers else torch.device("cpu")
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._adapters: dict[Version, _Adapter] = {}
        self._resident: OrderedDict[int, _Adapter] = OrderedDict()  # slot -> adapter, LRU first
        self._requests: dict[str, _Request] = {}
        self._copies: list[_Copy] = []
        self._next_order = 0
        self._queue: queue.Queue[_Adapter | None] = queue.Queue()
        self._thread = threading.Thread(target=self._load_loop, name="lora-loader", daemon=True)
        self._thread.start()
        _stores.add(self)

    # ---- step thread ----

    def acquire(self, request_id: str, choices: Sequence[LoraChoice]) -> None:
        """The request's adapters: loads start now for those not resident or loading."""
        if request_id in self._requests:
            raise ValueError(f"request '{request_id}' acquired its adapters already")
        request = _Request([], order=self._next_order)
        self._next_order += 1
        self._requests[request_id] = request
        for choice in choices:
            info = self.catalog.get(choice.name)
            if info is None or info.error:
                request.error = f"adapter '{choice.name}': {info.error if info else 'no longer in lora_dir'}"
                return
            with self._lock:
                adapter = self._adapters.get(info.version)
                if adapter is None:
                    adapter = self._adapters[info.version] = _Adapter(choice.name, info.version)
                    self._queue.put(adapter)
            request.adapters.append((adapter, choice.scale))
        self._update(request)

    def poll(self) -> None:
        """At a step boundary: copy loaded adapters into slots, oldest waiting request first."""
        self._drop_finished_copies()
        self._drop_unnamed()
        waiting = sorted(
            (r for r in self._requests.values() if not r.ready and not r.error), key=lambda r: r.order
        )
        for request in waiting:
            if not self._update(request) and self._make_resident(request) == "no_slots":
                break  # the oldest request that needs slots goes first

    def status(self, request_id: str) -> LoraStatus:
        request = self._requests.get(request_id)
        if request is None:
            return LoraStatus(ready=True)  # a request without adapters
        self._update(request)
        return LoraStatus(request.ready, request.error)

    def adapters(self, request_id: str) -> list[tuple[int, float]]:
        """(slot, scale) of a ready request's adapters, for LoraRows; [] for none."""
        request = self._requests.get(request_id)
        if request is None:
            return []
        if not request.ready:
            raise RuntimeError(f"request '{request_id}': its adapters are not resident")
        with self._lock:
            for adapter, _ in request.adapters:
                self._resident.move_to_end(adapter.slot)  # least recently used goes first
        return [(adapter.slot, scale) for adapter, scale in request.adapters]

    def release(self, request_id: str) -> None:
        """The request ended: its adapters may be evicted (they stay resident until needed)."""
        self._requests.pop(request_id, None)

    def resident_names(self) -> list[str]:
        with self._lock:
            return sorted({adapter.name for adapter in self._resident.values()})

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    # ---- internals ----

    def _update(self, request: _Request) -> bool:
        """Mark the request failed or ready from its adapters' state; True when it is settled."""
        if request.error or request.ready:
            return True
        for adapter, _ in request.adapters:
            if adapter.status == "failed":
                request.error = f"adapter '{adapter.name}' could not be loaded: {adapter.error}"
                return True
        request.ready = all(adapter.status == "resident" for adapter, _ in request.adapters)
        return request.ready

    def _make_resident(self, request: _Request) -> str:
        """ "ready", "loading" (an adapter is not read yet) or "no_slots"."""
        needed = [a for a, _ in request.adapters if a.status != "resident"]
        if any(a.status != "staged" for a in needed):
            return "loading"
        in_use = {a.slot for r in self._requests.values() if r.ready for a, _ in r.adapters}
        in_use |= {a.slot for a, _ in request.adapters if a.status == "resident"}
        free = [s for s in range(1, self.layers.num_slots + 1) if s not in self._resident]
        evictable = [s for s in self._resident if s not in in_use]
        if len(free) + len(evictable) < len(needed):
            return "no_slots"
        for adapter in needed:
            slot = free.pop(0) if free else self._evict(evictable.pop(0))
            self._write(adapter, slot)
        request.ready = True
        return "ready"

    def _named(self, adapter: _Adapter) -> bool:
        return any(a is adapter for r in self._requests.values() for a, _ in r.adapters)

    def _drop_unnamed(self) -> None:
        """Loaded adapters whose requests all ended before they got a slot: free their host copy."""
        with self._lock:
            for version, adapter in list(self._adapters.items()):
                if adapter.status == "staged" and not self._named(adapter):
                    del self._adapters[version]

    def _evict(self, slot: int) -> int:
        self.stats.evictions += 1
        with self._lock:
            adapter = self._resident.pop(slot)
            if self._named(adapter):
                adapter.status = "loading"  # a waiting request still names it: read it again
                self._queue.put(adapter)
            else:
                self._adapters.pop(adapter.version, None)
        logger.info("lora: evicted '%s' from slot %d", adapter.name, slot)
        return slot

    def _write(self, adapter: _Adapter, slot: int) -> None:
        with self._lock:
            packed, adapter.packed = adapter.packed, None
            adapter.status, adapter.slot = "resident", slot
        self.layers.write(slot, packed)
        copy = _Copy(packed)
        if self.device.type == "cuda":
            copy.event = torch.cuda.Event()
            copy.event.record()
        self._copies.append(copy)  # the host tensors live until the copy has run
        with self._lock:
            self._resident[slot] = adapter
        logger.info("lora: '%s' resident in slot %d (loaded in %.3f s)", adapter.name, slot, adapter.load_s)

    def _drop_finished_copies(self) -> None:
        self._copies = [c for c in self._copies if c.event is not None and not c.event.query()]

    def _load_loop(self) -> None:
        while True:
            adapter = self._queue.get()
            if adapter is None:
                return
            started = time.perf_counter()
            try:
                weights = load_adapter(adapter.version[0], self.rules, self.layers.modules)
                packed = self.layers.pack(weights, pin=self.device.type == "cuda")
                error = ""
            except AdapterFileError as exc:
                packed, error = None, str(exc)
            except Exception as exc:  # a bad file must fail its requests, never the loader
                logger.exception("lora: loading '%s' failed", adapter.name)
                packed, error = None, f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - started
            with self._lock:
                adapter.load_s = elapsed
                if error:
                    adapter.status, adapter.error = "failed", error
                    self.stats.failures += 1
                    logger.error("lora: adapter '%s' cannot be used: %s", adapter.name, error)
                else:
                    adapter.status, adapter.packed = "staged", packed
                    self.stats.loads += 1
                    self.stats.load_s.append(elapsed)
            if self.on_loaded is not None:
                self.on_loaded()
