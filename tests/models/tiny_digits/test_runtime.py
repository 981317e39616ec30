"""tiny-digits through the real Runtime (worker process, DenoiseNode batching): 8 requests in flight."""

import asyncio

import numpy as np
import pytest

from mstar.config import ServerConfig
from mstar.graph import GenerationParams
from mstar.models.registry import get_model_spec
from mstar.models.tiny_digits import data
from mstar.runtime.events import Progress
from mstar.runtime.runtime import Runtime

NUM_IN_FLIGHT = 8
NUM_STEPS = 10
BOOT_AND_RUN_TIMEOUT_S = 120.0


def digit_params(spec, digit: int, seed: int) -> dict:
    prompt = data.prompt_for(digit, seed)
    return spec.validate(GenerationParams(prompt=prompt, seed=seed, num_inference_steps=NUM_STEPS))


async def serve_twice(spec, params_list: list[dict]) -> tuple[list[dict], list[dict], list[tuple[int, int]]]:
    progress: list[tuple[int, int]] = []
    runtime = Runtime(ServerConfig(model="tiny-digits", device="cpu"), spec)
    await runtime.start()
    try:
        assert runtime.ready
        first_handles = [runtime.submit(params) for params in params_list]
        assert runtime.stats().num_running + runtime.stats().num_waiting == len(params_list)
        async for event in first_handles[0].events():
            if isinstance(event, Progress):
                progress.append((event.step, event.total))
        first = await asyncio.gather(*(handle.result() for handle in first_handles))
        # one at a time: the same seed in the same batch company (alone) must give the same bytes
        second = [await runtime.submit(params_list[0]).result() for _ in range(2)]
    finally:
        await runtime.shutdown()
    return first, second, progress


@pytest.fixture(scope="module")
def classifier():
    train_split, _ = data.load_splits()
    return data.train_classifier(train_split)


def test_eight_requests_in_flight_draw_their_digits_and_repeat_exactly(classifier):
    spec = get_model_spec("tiny-digits")
    digits = list(range(NUM_IN_FLIGHT))
    params_list = [digit_params(spec, digit, seed=digit + 100) for digit in digits]
    run = asyncio.wait_for(serve_twice(spec, params_list), BOOT_AND_RUN_TIMEOUT_S)
    first, second, progress = asyncio.run(run)

    frames = np.concatenate([outputs["frames"] for outputs in first])
    assert frames.shape == (NUM_IN_FLIGHT, 256, 256, 3) and frames.dtype == np.uint8
    predicted = data.classify(classifier, data.ink_grid_from_frames(frames))
    assert (predicted == np.array(digits)).mean() >= 0.875, f"asked {digits}, got {predicted}"
    assert second[0]["frames"].tobytes() == second[1]["frames"].tobytes()
    assert progress and progress[-1] == (NUM_STEPS, NUM_STEPS)
