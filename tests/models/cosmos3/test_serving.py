"""Cosmos3 served through its nodes (the dit node's understanding prefix in the paged KV pool, the
packed generation loop, the VAE nodes) on the tiny Edge-like folder, in float32 on the CPU: against
Cosmos3OmniPipeline, the prefix cache, packing, and the pool's pages after every kind of ending;
then over HTTP with the openai client."""

from __future__ import annotations

import time

import pytest
import torch

from mstar.bench.parity import run_ours
from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState
from mstar.models.cosmos3.model import TinyCosmos3Spec
from tests.models.cosmos3.reference import LoopRequest, psnr_db, run_diffusers

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks videos.* deprecated
SPEC_PATH = "mstar.models.cosmos3.model:TinyCosmos3Spec"
REQUEST = {"prompt": "a robot arm pours water", "num_frames": 5, "width": 32, "height": 32,
           "num_inference_steps": 3, "guidance_scale": 6.0, "seed": 0}  # fmt: skip


def build(folder=None, **config):
    spec = TinyCosmos3Spec()
    server = ServerConfig(device="cpu", compile_mode="off", warmup=False, **config)
    ctx = BuildContext(
        config=server, device="cpu", node_names=spec.node_names,
        model_path=None if folder is None else str(folder), random_weights=folder is None,
    )  # fmt: skip
    return spec, spec.build_nodes(ctx)


@pytest.fixture(scope="module")
def served(edge_folder):
    folder, _ = edge_folder
    return build(folder)


def prefixes(nodes):
    return nodes["dit"].pipeline.prefixes


def assert_no_pages_held(nodes):
    cache = prefixes(nodes)
    assert cache.num_held == 0 and cache.pool.pages.stats().num_used == 0


@pytest.mark.parametrize("guidance_scale", [6.0, 1.0], ids=["guidance", "no-guidance"])
def test_the_served_nodes_match_the_pipeline(edge_folder, served, guidance_scale):
    _, pipe = edge_folder
    spec, nodes = served
    fields = {**REQUEST, "guidance_scale": guidance_scale}
    ours = run_ours(spec, nodes, fields)["frames"]
    theirs = run_diffusers(pipe, LoopRequest(**{k: v for k, v in fields.items()}))  # [F, 3, H, W]
    theirs_uint8 = (theirs.permute(0, 2, 3, 1) * 255).round().clamp(0, 255)
    assert ours.shape == theirs_uint8.shape
    assert psnr_db(ours.double() / 255, theirs_uint8.double() / 255) >= 40.0
    assert_no_pages_held(nodes)


def test_a_repeated_prompt_reuses_its_pages_and_gives_the_same_bytes(edge_folder):
    folder, _ = edge_folder
    spec, nodes = build(folder)  # a cold pool
    cache = prefixes(nodes)
    cold = run_ours(spec, nodes, REQUEST)["frames"]
    assert (cache.num_computed, cache.num_hits) == (2, 0)  # one understanding forward per label
    warm = run_ours(spec, nodes, REQUEST)["frames"]
    assert (cache.num_computed, cache.num_hits) == (2, 2)  # nothing recomputed
    assert torch.equal(cold, warm)
    other = run_ours(spec, nodes, {**REQUEST, "prompt": "a dog runs"})["frames"]
    assert cache.num_computed == 3 and cache.num_hits == 3  # its negative prompt is the same one
    assert not torch.equal(other, cold)
    assert_no_pages_held(nodes)


def test_the_prefix_cache_changes_nothing_and_the_understanding_runs_once_per_label(edge_folder):
    """With the prefix cache off every request runs the understanding pathway once per label (not
    once per step); the frames are byte-identical to a cached server's, cold and warm."""
    folder, _ = edge_folder
    spec, uncached = build(folder, enable_prefix_caching=False)
    _, cached = build(folder)
    dit = uncached["dit"].pipeline.dit
    plain = [run_ours(spec, uncached, REQUEST)["frames"] for _ in range(2)]
    assert dit.num_understanding_forwards == 4  # 2 requests x 2 labels, each over 3 steps
    assert (prefixes(uncached).num_computed, prefixes(uncached).num_hits) == (4, 0)
    cold, warm = (run_ours(spec, cached, REQUEST)["frames"] for _ in range(2))
    assert cached["dit"].pipeline.dit.num_understanding_forwards == 2 and prefixes(cached).num_hits == 2
    for frames in (plain[1], cold, warm):
        assert torch.equal(frames, plain[0])
    assert_no_pages_held(uncached)


def _loop(node, requests):
    for request in requests:
        node.prepare(request)
    while not all(node.check_stop(r) for r in requests):
        node.forward([r for r in requests if not node.check_stop(r)])


def _request(spec, rid, **fields):
    return RequestState(rid, spec.validate(GenerationParams(**{**REQUEST, **fields})))


def test_a_request_alone_and_packed_with_another_gives_the_same_latents(served):
    spec, nodes = served
    node = nodes["dit"]
    alone = _request(spec, "alone")
    _loop(node, [alone])
    first, second = (
        _request(spec, "a"),
        _request(spec, "b", width=48, num_frames=9, seed=3, guidance_scale=1.0),
    )
    _loop(node, [first, second])
    assert torch.equal(alone.tensors["latents"], first.tensors["latents"])
    for request in (alone, first, second):
        node.release(request)
    assert_no_pages_held(nodes)


def test_no_pages_are_left_after_a_failure_or_a_cancel(served, monkeypatch):
    spec, nodes = served
    node = nodes["dit"]
    cancelled = _request(spec, "cancelled", prompt="cancelled midway")
    node.prepare(cancelled)
    node.forward([cancelled])
    assert prefixes(nodes).num_held == 2
    node.release(cancelled)  # what the step loop calls on abort
    assert_no_pages_held(nodes)

    failing = _request(spec, "failing", prompt="fails midway")
    node.prepare(failing)
    monkeypatch.setattr(node.pipeline.dit, "generate", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        node.forward([failing])
    node.release(failing)  # what the step loop calls when a request fails
    node.release(failing)  # twice is harmless
    assert_no_pages_held(nodes)


def test_an_understanding_forward_that_fails_holds_nothing(served, monkeypatch):
    spec, nodes = served
    node = nodes["dit"]
    calls = []

    def understand(ids, attention):
        calls.append(ids)
        if len(calls) == 2:  # the second label's
            raise RuntimeError("understanding failed")
        return original(ids, attention)

    original = node.pipeline.dit.understand
    monkeypatch.setattr(node.pipeline.dit, "understand", understand)
    with pytest.raises(RuntimeError, match="understanding failed"):
        node.prepare(_request(spec, "x", prompt="a prompt never seen before", negative_prompt="nor this"))
    assert_no_pages_held(nodes)


def test_a_full_pool_fails_the_request_clearly_and_holds_nothing():
    spec, nodes = build(kv_pool_pages=260)  # random weights; 2 prompts of at most 2048 tokens
    node = nodes["dit"]
    first = _request(spec, "long", prompt="x" * 4000)  # ~4000 tokens per label: 250 pages
    with pytest.raises(ValueError, match="at most 2048"):
        node.prepare(first)
    held = [_request(spec, f"r{i}", prompt="y" * 1900 + str(i), guidance_scale=1.0) for i in range(3)]
    from mstar.engine.kv.prefix import PoolExhausted

    node.prepare(held[0])
    node.prepare(held[1])
    with pytest.raises(PoolExhausted, match="no room"):
        node.prepare(held[2])
    for request in held:
        node.release(request)
    assert_no_pages_held(nodes)


def test_cosmos3_makes_an_mp4_over_http_and_refuses_the_modes_it_lacks(edge_folder):
    openai = pytest.importorskip("openai")
    from mstar.api.app import create_app
    from mstar.api.media import decode_mp4
    from tests.api.live import LiveServer
    from tests.serving.test_models_over_http import KEY, openai_client

    folder, _ = edge_folder
    config = ServerConfig(
        model=SPEC_PATH, model_path=str(folder), api_key=KEY, compile_mode="off", warmup=False
    )
    with LiveServer(create_app(config, TinyCosmos3Spec())) as server:
        client = openai_client(server)
        video = client.videos.create(
            model="tiny-cosmos3", prompt="a red fox runs", size="32x48",
            extra_body={"num_frames": 5, "fps": 8, "num_inference_steps": 2, "seed": 7},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while video.status not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.05)
            video = client.videos.retrieve(video.id)
        assert video.status == "completed", video
        frames = decode_mp4(client.videos.download_content(video.id).read())
        refused = {}
        for field, value in (("audio", True), ("action", "0.1 0.2"), ("enable_sound", True)):
            with pytest.raises(openai.BadRequestError) as error:  # sound and action modes: not built
                client.videos.create(model="tiny-cosmos3", prompt="a dog barks", extra_body={field: value})
            refused[field] = error.value.body["param"]
    assert frames.shape == (5, 48, 32, 3) and frames.std() > 0
    assert refused == {"audio": "audio", "action": "action", "enable_sound": "enable_sound"}


def test_cosmos3_makes_an_image_over_http(edge_folder, served):
    """/v1/images/generations on a video model that also serves images: its one-frame video, the
    same pixels as the request through the nodes (PNG is lossless); bad input is a 400 naming it."""
    openai = pytest.importorskip("openai")
    import base64
    import io

    import numpy as np
    from PIL import Image

    from mstar.api.app import create_app
    from tests.api.live import LiveServer
    from tests.serving.test_models_over_http import KEY, openai_client

    folder, _ = edge_folder
    spec, nodes = served
    config = ServerConfig(
        model=SPEC_PATH, model_path=str(folder), api_key=KEY, compile_mode="off", warmup=False
    )
    settings = {"num_inference_steps": 2, "guidance_scale": 6.0, "seed": 3}
    with LiveServer(create_app(config, TinyCosmos3Spec())) as server:
        client = openai_client(server)
        shaped = client.images.generate(
            model="tiny-cosmos3", prompt="a red cube on a table", size="48x32",
            response_format="b64_json", extra_body=settings,
        )  # fmt: skip
        default = client.images.generate(model="tiny-cosmos3", prompt="a red cube", extra_body=settings)
        with pytest.raises(openai.BadRequestError) as too_wide:
            client.images.generate(model="tiny-cosmos3", prompt="a cube", size="1024x32")
        with pytest.raises(openai.BadRequestError) as with_frames:
            client.images.generate(model="tiny-cosmos3", prompt="a cube", extra_body={"num_frames": 5})
        card = client.models.list().data[0]
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(shaped.data[0].b64_json))))
    fields = {"prompt": "a red cube on a table", "num_frames": 1, "width": 48, "height": 32, **settings}
    assert shaped.size == "48x32" and image.shape == (32, 48, 3) and image.std() > 0
    assert np.array_equal(image, run_ours(spec, nodes, fields)["frames"][0].numpy())
    recipe = spec.config.recipe
    assert default.size == f"{recipe.image_width}x{recipe.image_height}"  # the recipe's image size
    assert too_wide.value.body["param"] == "width"
    assert with_frames.value.body["param"] == "num_frames"
    assert card.media_kinds == ["video", "image"]
