"""Through the real HTTP server and runtime (fake numpy model): an out-of-memory step fails only
its batch with a clear 503 and the server keeps serving; a recompile in traffic is logged as a
warning and counted in /metrics."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mstar.api.app import create_app
from mstar.config import ServerConfig
from mstar.engine.memory import is_out_of_memory, release_cached_memory
from tests.api.live import LiveServer
from tests.serving.fake_serving import OOM_SEED, SPEC_PATH, ServingSpec

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(model=SPEC_PATH, warmup=False)
    with LiveServer(create_app(config, ServingSpec())) as live:
        yield live


async def post_seeds(base_url: str, seeds: list[int]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S) as client:
        bodies = [{"model": "serving-fake", "prompt": "p", "seed": seed} for seed in seeds]
        return await asyncio.gather(*(client.post("/v1/images/generations", json=b) for b in bodies))


def recompiles_counted(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mstar:recompiles_total" and sample.labels.get("node") == "denoiser":
                return sample.value
    return 0.0


def test_out_of_memory_fails_only_its_batch_and_serving_goes_on(server):
    oom, neighbour = asyncio.run(post_seeds(server.base_url, [OOM_SEED, 2]))
    assert oom.status_code == 503, oom.text
    error = oom.json()["error"]
    assert error["code"] == "out_of_memory" and "out of memory" in error["message"]
    assert neighbour.status_code == 200, neighbour.text  # another batch of the same step loop
    (after,) = asyncio.run(post_seeds(server.base_url, [4]))
    assert after.status_code == 200, after.text


def test_a_recompile_in_traffic_is_logged_and_counted(server, caplog):
    before = recompiles_counted(server.base_url)
    with caplog.at_level(logging.WARNING, logger="mstar"):
        (response,) = asyncio.run(post_seeds(server.base_url, [3]))  # odd seed: each of 2 steps recompiles
    assert response.status_code == 200, response.text
    assert recompiles_counted(server.base_url) == before + 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("denoiser recompiled" in message for message in warnings), warnings


class OutOfMemoryError(RuntimeError):
    """What a build without torch.cuda's class would raise: recognised by name."""


@pytest.mark.parametrize(
    "error, expected",
    [
        (OutOfMemoryError("boom"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 1 GiB)"), True),
        (RuntimeError("kernel exploded"), False),
        (ValueError("bad prompt"), False),
    ],
)
def test_out_of_memory_is_recognised_by_class_or_allocator_message(error, expected):
    assert is_out_of_memory(error) is expected


def test_torch_out_of_memory_error_is_recognised_and_release_is_safe_without_cuda():
    import torch

    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    release_cached_memory()  # no CUDA here: must not initialise it or raise
    assert not torch.cuda.is_initialized()


@pytest.mark.gpu
def test_a_real_cuda_out_of_memory_is_recognised_and_its_memory_given_back():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    held_bytes = 2 * 1024**3

    def step_that_runs_out() -> None:
        activations = torch.empty(held_bytes, dtype=torch.uint8, device="cuda")  # freed with the frame
        activations.add_(1)
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # a petabyte: out of memory

    reserved_before = torch.cuda.memory_reserved()
    try:
        step_that_runs_out()
    except Exception as error:  # noqa: BLE001 - the step loop's catch-all, as in _run_forward
        recognised = is_out_of_memory(error)
    assert recognised
    assert torch.cuda.memory_reserved() >= reserved_before + held_bytes  # cached by the allocator
    release_cached_memory()
    assert torch.cuda.memory_reserved() < reserved_before + held_bytes
    torch.empty(held_bytes, dtype=torch.uint8, device="cuda")  # and the device serves again
