"""Host-time profile of chosen nodes' forwards, for finding where a step's host time goes.

    MSTAR_PROFILE_NODES=text_encoder,dit MSTAR_PROFILE_DIR=/tmp/profiles mstar serve ...

Each worker runs those nodes' forwards under cProfile and, after every profiled forward, rewrites
`<dir>/<node>-worker<k>.txt`: the forwards' count and host time, then the functions by cumulative
and by own time. A diagnostic: profiling slows the profiled nodes. Unset, it costs one dict lookup
per forward.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
from collections.abc import Iterator
from pathlib import Path

NODES_ENV = "MSTAR_PROFILE_NODES"
DIR_ENV = "MSTAR_PROFILE_DIR"
NUM_FUNCTIONS_LISTED = 40


class NodeProfiler:
    def __init__(self, worker: int, node_names: set[str], out_dir: Path | None):
        self.worker = worker
        self.out_dir = out_dir
        self._profiles = {name: cProfile.Profile() for name in node_names} if out_dir else {}
        self._num_forwards: dict[str, int] = {}

    @classmethod
    def from_env(cls, worker: int) -> NodeProfiler:
        names = {name.strip() for name in os.environ.get(NODES_ENV, "").split(",") if name.strip()}
        out_dir = Path(os.environ.get(DIR_ENV) or "mstar-profiles") if names else None
        return cls(worker, names, out_dir)

    @contextlib.contextmanager
    def around(self, node_name: str) -> Iterator[None]:
        profile = self._profiles.get(node_name)
        if profile is None:
            yield
            return
        profile.enable()
        try:
            yield
        finally:
            profile.disable()
            self._num_forwards[node_name] = self._num_forwards.get(node_name, 0) + 1
            self._write(node_name, profile)

    def _write(self, node_name: str, profile: cProfile.Profile) -> None:
        num_forwards = self._num_forwards[node_name]
        text = io.StringIO()
        stats = pstats.Stats(profile, stream=text)
        text.write(
            f"{node_name} on worker {self.worker}: {num_forwards} forward(s), "
            f"{1000 * stats.total_tt / num_forwards:.1f} ms host time each (profiled)\n"
        )
        stats.sort_stats("cumulative").print_stats(NUM_FUNCTIONS_LISTED)
        stats.sort_stats("tottime").print_stats(NUM_FUNCTIONS_LISTED)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"{node_name}-worker{self.worker}.txt").write_text(text.getvalue())
