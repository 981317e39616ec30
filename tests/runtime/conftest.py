"""The module-wide event loop the runtime tests drive (no asyncio plugin needed)."""

import asyncio

import pytest


@pytest.fixture(scope="module")
def loop():
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()
