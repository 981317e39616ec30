"""Helpers for runtime tests over the fake models."""

import asyncio

from mstar.config import NodeGroup, ServerConfig
from mstar.runtime.events import Done, Failed, Progress
from tests.runtime.fake_models import SPEC_PATH

TWO_GROUPS = [NodeGroup(nodes=["encoder", "decoder"]), NodeGroup(nodes=["aux", "denoiser"])]


def make_config(**overrides) -> ServerConfig:
    overrides.setdefault("node_groups", TWO_GROUPS)
    overrides.setdefault("model", SPEC_PATH)
    return ServerConfig(**overrides)


def run(loop, awaitable, timeout_s: float = 20.0):
    return loop.run_until_complete(asyncio.wait_for(awaitable, timeout_s))


async def until_progress(events, step: int) -> Progress:
    """Consume `events` (an events() iterator) until Progress reaches `step`."""
    async for event in events:
        assert isinstance(event, Progress), f"ended before step {step}: {event}"
        if event.step >= step:
            return event
    raise AssertionError("events ended")


async def final_event(events) -> Done | Failed:
    async for event in events:
        if isinstance(event, Done | Failed):
            return event
    raise AssertionError("events ended without Done or Failed")


async def wait_for(condition, timeout_s: float = 10.0, interval_s: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)
