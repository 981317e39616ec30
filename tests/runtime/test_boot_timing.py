"""The boot log says where boot time goes: node builds, node warmups, workers up, warmup requests."""

import logging
import os
import re

from mstar.runtime import messages as m
from mstar.runtime.runtime import Runtime
from mstar.runtime.worker import build_group
from tests.runtime.fake_models import SPEC_PATH, WarmupSpec
from tests.runtime.helpers import make_config, run

SECONDS = r"\d+\.\d s"


def test_build_group_logs_the_build_and_each_node_warmup_with_their_seconds(caplog):
    caplog.set_level(logging.INFO, logger="mstar.worker")
    boot = m.WorkerBoot(make_config().model_dump_json(), SPEC_PATH, 1, 0, "", "", "", "")
    _, _, nodes, _ = build_group(boot, lambda label, done, total: None)
    messages = [record.getMessage() for record in caplog.records if record.name == "mstar.worker"]
    assert list(nodes) == ["aux", "denoiser"]
    assert re.fullmatch(f"built node\\(s\\) aux,denoiser on cpu in {SECONDS}", messages[0])
    assert re.fullmatch(f"node aux warmed up in {SECONDS}", messages[1])
    assert re.fullmatch(f"node denoiser warmed up in {SECONDS}", messages[2])


def test_runtime_start_logs_workers_up_warmup_total_and_ready_seconds(loop, caplog):
    caplog.set_level(logging.INFO, logger="mstar.runtime")
    runtime = Runtime(make_config(), WarmupSpec())
    try:
        run(loop, runtime.start())
    finally:
        run(loop, runtime.shutdown(timeout_s=2.0))
    messages = [record.getMessage() for record in caplog.records if record.name == "mstar.runtime"]
    summary = f"boot: workers up in {SECONDS}, 1 warmup request\\(s\\) in {SECONDS}, ready after {SECONDS}"
    assert any(re.fullmatch(f"boot: 2 worker\\(s\\) up in {SECONDS}", line) for line in messages)
    assert any(re.fullmatch(f"warmup request 1/1 done in {SECONDS}", line) for line in messages)
    assert any(re.fullmatch(summary, line) for line in messages), messages


def test_heartbeat_memory_read_waits_for_the_nodes_and_never_raises(monkeypatch):
    """The heartbeat thread runs from the start of the boot, while torch may still be importing on
    the main thread; a read that fails must not stop the beats (missing beats mark a worker dead)."""
    from mstar.runtime import worker as worker_module

    worker = worker_module.Worker.__new__(worker_module.Worker)
    worker.loop = None
    monkeypatch.setattr(worker_module, "take_peak_allocated_bytes", lambda: 7)
    assert worker._peak_allocated_bytes() == 0  # nodes not built yet
    worker.loop = object()
    assert worker._peak_allocated_bytes() == 7

    def half_imported_torch() -> int:
        raise AttributeError("partially initialized module 'torch' has no attribute 'cuda'")

    monkeypatch.setattr(worker_module, "take_peak_allocated_bytes", half_imported_torch)
    assert worker._peak_allocated_bytes() == 0


def test_a_worker_on_a_numbered_gpu_makes_it_the_current_device(monkeypatch):
    import torch

    from mstar.runtime.worker import use_device

    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    for device in ("cpu", "cuda", "cuda:1"):
        use_device(device)
    assert chosen == [torch.device("cuda:1")]


def test_a_worker_keeps_compiled_kernels_in_the_configured_cache_dir(monkeypatch, tmp_path):
    from mstar.engine.compile import INDUCTOR_CACHE_ENV, TRITON_CACHE_ENV

    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "")  # recorded, so the worker's value is undone after
    monkeypatch.delenv(INDUCTOR_CACHE_ENV)
    monkeypatch.setenv(TRITON_CACHE_ENV, "/chosen/by/the/user")
    config = make_config(compile_cache_dir=str(tmp_path / "kernels"))
    build_group(m.WorkerBoot(config.model_dump_json(), SPEC_PATH, 0, 0, "", "", "", ""), lambda *_: None)
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "kernels" / "inductor")
    assert os.environ[TRITON_CACHE_ENV] == "/chosen/by/the/user"  # what the user set wins
