"""Z-Image (tiny) served by the real runtime: two workers, text embeddings crossing between them."""

import asyncio

import numpy as np
import pytest

from mstar.config import NodeGroup, ServerConfig
from mstar.graph import BuildContext, RequestState
from mstar.models.zimage.model import ZImageParams
from mstar.runtime.runtime import Runtime
from tests.models.zimage.test_generation import generate
from tests.models.zimage.tiny_parts import TINY_SPEC_PATH, TinyZImageSpec


@pytest.fixture(scope="module")
def loop():
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def run(loop, awaitable, timeout_s: float = 120.0):
    return loop.run_until_complete(asyncio.wait_for(awaitable, timeout_s))


def test_two_workers_generate_what_the_nodes_generate(loop, tiny_folder):
    folder, _ = tiny_folder
    spec = TinyZImageSpec()
    groups = [NodeGroup(nodes=["text_encoder"]), NodeGroup(nodes=["dit", "vae_decoder"])]
    config = ServerConfig(
        model=TINY_SPEC_PATH, model_path=str(folder), node_groups=groups, compile_mode="off", warmup=False
    )
    # Below the served minimum size (validate would refuse it): the tiny VAE upsamples only 2x.
    params = {"prompt": "a green hill", "negative_prompt": "", "width": 64, "height": 48}
    params = ZImageParams(**params, num_inference_steps=3, guidance_scale=0.0, seed=5)
    runtime = Runtime(config, spec)
    run(loop, runtime.start())
    try:
        outputs = run(loop, runtime.submit(params, request_id="zimage-1").result())
    finally:
        run(loop, runtime.shutdown(timeout_s=5.0))
    frames = outputs["frames"]
    assert frames.dtype == np.uint8 and frames.shape == (1, 48, 64, 3)

    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, model_path=str(folder))
    direct = RequestState("direct", params)
    generate(spec.build_nodes(ctx), [direct])
    assert np.array_equal(frames, direct.tensors["frames"].numpy())
