"""Requests wait until every worker that is up has applied the newest Peers table (PeersKnown):
a peer's handoff travels on another connection than the conductor's broadcast and can overtake it,
and a worker that does not know a peer yet fails the request as if that peer were down."""

from mstar.config import NodeGroup
from mstar.runtime import messages as m
from mstar.runtime.pool import WorkerPool
from mstar.runtime.runtime import Runtime
from tests.runtime.fake_models import FakeSpec
from tests.runtime.helpers import make_config, run

TEMPLATE = m.WorkerBoot("{}", "spec", 0, 0, "", "ipc:///tmp/none", "/tmp", "p-")


def _pool_with_two_ready_workers(tmp_path) -> WorkerPool:
    groups = [NodeGroup(nodes=["a"]), NodeGroup(nodes=["b"])]
    pool = WorkerPool(groups, TEMPLATE, "ipc", str(tmp_path))
    for worker in pool.workers:
        worker.incarnation = 1
    for index in (0, 1):  # each Ready broadcasts the table to the workers up so far
        pool.on_ready(m.Ready(index, 1, f"ipc://{tmp_path}/w{index}"))
    return pool


def test_settled_only_when_every_worker_up_applied_the_newest_table(tmp_path):
    pool = _pool_with_two_ready_workers(tmp_path)
    try:
        assert pool.all_up and pool.peers_version == 2 and not pool.peers_settled
        assert not pool.on_peers_known(m.PeersKnown(0, 1, 1))  # worker 0's first table: stale
        assert not pool.on_peers_known(m.PeersKnown(0, 1, 2))
        assert not pool.on_peers_known(m.PeersKnown(1, 0, 2))  # an earlier incarnation: ignored
        assert pool.on_peers_known(m.PeersKnown(1, 1, 2))
        assert pool.peers_settled
    finally:
        pool.close()


def test_runtime_start_returns_with_the_tables_settled(loop):
    runtime = Runtime(make_config(), FakeSpec())
    try:
        run(loop, runtime.start())
        assert runtime._pool.peers_settled and runtime._pool.peers_version >= 1
    finally:
        run(loop, runtime.shutdown(timeout_s=2.0))
