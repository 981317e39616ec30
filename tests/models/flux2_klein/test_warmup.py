"""Boot warmup covers edits as well as text-to-image: the nodes as nodes.py builds them, compiling
on the CPU as they would on CUDA (inductor's code generation replaced by the traced graph run
eagerly: its C++ build is slow, and compiles are counted by our own counters either way). After
each node's warmup at a configured size, a first text-to-image request and a first edit with two
references at that size compile nothing; an edit at a size not configured is served at once while
its VAE encode and decode compile on the compile thread, then swapped in."""

import threading

import numpy as np
import pytest
import torch
from PIL import Image

from mstar.config import ServerConfig
from mstar.engine.checked_compile import COMPILED, PENDING, BackgroundCompiler, module_calls, off_serving_path
from mstar.graph import BuildContext, reference_image_input
from mstar.models.flux2_klein.geometry import reference_pixel_size
from mstar.models.flux2_klein.model import WARMUP_NUM_REFERENCES, Flux2KleinSpec
from tests.models.flux2_klein.test_serving import generate, make_request
from tests.models.flux2_klein.tiny_parts import TinyFlux2KleinSpec

HANG_GUARD_S = 120.0
SIZE = 64  # the configured compile size (64x64); the tiny VAE's granularity is 8 pixels


class TracedGraphCompile:
    """Stands in for inductor's compile_fx: the traced graph runs eagerly. A compile on the compile
    thread waits for `gate` (open unless a test closes it)."""

    def __init__(self):
        self.gate, self.blocked = threading.Event(), threading.Event()
        self.gate.set()

    def __call__(self, graph, inputs, config_patches=None):
        if off_serving_path():
            self.blocked.set()
            assert self.gate.wait(HANG_GUARD_S)
        return graph.forward


@pytest.fixture
def compiling(monkeypatch):
    """CPU nodes compile as CUDA ones do (effective_mode keeps the mode), on a compile thread of
    this test's own."""
    fake = TracedGraphCompile()
    compiler = BackgroundCompiler()
    monkeypatch.setattr("mstar.engine.compile.effective_mode", lambda mode, device: mode)
    monkeypatch.setattr("torch._inductor.compile_fx.compile_fx", fake)
    monkeypatch.setattr("mstar.engine.checked_compile._shared_compiler", compiler)
    torch._dynamo.reset()  # graphs of other tests guard on other modules
    yield fake, compiler
    fake.gate.set()
    assert compiler.wait_idle(HANG_GUARD_S)
    torch._dynamo.reset()


def warmed_nodes(folder):
    """The tiny nodes, compiled (mode "default") and warmed up at SIZE x SIZE as a worker does."""
    spec = TinyFlux2KleinSpec()
    config = ServerConfig(
        model=spec.name, compile_mode="default", compile_sizes=[f"{SIZE}x{SIZE}"], warmup=True
    )
    ctx = BuildContext(config=config, device="cpu", node_names=spec.node_names, model_path=str(folder))
    nodes = spec.build_nodes(ctx)
    for node in nodes.values():
        node.warmup()
    return spec, nodes


def compile_counts(nodes) -> dict[str, tuple[int, int]]:
    """(serving-path compiles, background compiles) of every compiled part, by node."""
    parts = {
        "dit": nodes["dit"].compiled.parts,
        "vae_encoder": nodes["vae_encoder"].pipeline.encoder.parts,
        "vae_decoder": nodes["vae_decoder"].pipeline.decoder.parts,
    }
    return {
        name: (sum(p.num_compiles for p in ps), sum(p.num_background_compiles for p in ps))
        for name, ps in parts.items()
    }


def noise_images(width: int, height: int, count: int = 2) -> list[Image.Image]:
    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(count)]


def serve(nodes, requests):
    with module_calls():  # as the step loop calls nodes while a background compile may trace
        return generate(nodes, requests)


def checked(nodes, name: str):
    """The encode's ("encode") or the decode's CheckedCompile: which sizes are served compiled."""
    function = (
        nodes["vae_encoder"].pipeline.encoder if name == "encode" else nodes["vae_decoder"].pipeline.decoder
    )
    return function.checked


def test_after_warmup_a_first_generation_and_a_first_edit_at_the_configured_size_compile_nothing(
    compiling, tiny_folder
):
    _, compiler = compiling
    spec, nodes = warmed_nodes(tiny_folder[0])
    at_ready = compile_counts(nodes)
    assert all(serving >= 1 and background == 0 for serving, background in at_ready.values())
    encode_key = (1, 3, SIZE, SIZE)  # the references' pixels, as large as the output
    decode_key = spec.geometry.latent_grid(SIZE, SIZE)
    assert checked(nodes, "encode").keys(COMPILED) == {encode_key}
    assert checked(nodes, "decode").keys(COMPILED) == {decode_key}

    dit = nodes["dit"].pipeline.dit
    rotary_builds = []  # rotary tables built after warmup: a first call's host work
    eager_rotary = dit._rotary
    dit._rotary = lambda position_ids: rotary_builds.append(len(position_ids)) or eager_rotary(position_ids)

    t2i = make_request(
        spec, "t2i", prompt="a lighthouse", width=SIZE, height=SIZE, num_inference_steps=2, seed=1
    )
    serve(nodes, [t2i])
    edit = make_request(
        spec, "edit", noise_images(SIZE, SIZE, WARMUP_NUM_REFERENCES), prompt="side by side", width=SIZE,
        height=SIZE, num_inference_steps=2, seed=2,
    )  # fmt: skip
    serve(nodes, [edit])
    pair = [
        make_request(spec, "t2i-2", prompt="a", width=SIZE, height=SIZE, num_inference_steps=2, seed=3),
        make_request(spec, "edit-2", noise_images(SIZE, SIZE), prompt="b", width=SIZE, height=SIZE,
                     num_inference_steps=2, seed=4),
    ]  # fmt: skip
    serve(nodes, pair)  # packed in one step
    assert all(request.tensors["frames"].shape == (1, SIZE, SIZE, 3) for request in pair)
    assert compile_counts(nodes) == at_ready  # nothing compiled, on the serving path or off it
    assert [node.num_recompiles() for node in nodes.values()] == [0, 0, 0, 0]
    assert not compiler.busy
    assert rotary_builds == []  # the edit's reference grids were built at warmup too
    for name in ("encode", "decode"):  # every call took the compiled path: no new key was seen
        assert not checked(nodes, name).keys(PENDING)
    assert checked(nodes, "encode").keys(COMPILED) == {encode_key}


def test_an_edit_at_a_size_not_configured_is_served_at_once_and_its_vae_compiles_off_the_path(
    compiling, tiny_folder
):
    fake, compiler = compiling
    spec, nodes = warmed_nodes(tiny_folder[0])
    at_ready = compile_counts(nodes)
    fake.gate.clear()  # background compiles wait: the request must not
    width, height = 96, 72  # references at least 64 pixels a side
    images = noise_images(width, height)
    first = make_request(spec, "new", images, prompt="new size", num_inference_steps=2, seed=5)
    serve(nodes, [first])
    assert first.tensors["frames"].shape == (1, height, width, 3)
    assert fake.blocked.wait(HANG_GUARD_S)
    encode_key = (1, 3, *reversed(reference_pixel_size(width, height, spec.geometry.vae_scale)))
    assert checked(nodes, "encode").state(encode_key) == PENDING
    fake.gate.set()
    assert compiler.wait_idle(HANG_GUARD_S)
    assert checked(nodes, "encode").state(encode_key) == COMPILED
    assert checked(nodes, "decode").state(spec.geometry.latent_grid(width, height)) == COMPILED
    counts = compile_counts(nodes)
    assert counts["dit"] == at_ready["dit"]  # the pack length is dynamic: no new graph
    for name in ("vae_encoder", "vae_decoder"):
        assert counts[name] == (at_ready[name][0], 1)  # one compile each, off the serving path
    again = make_request(spec, "new-2", images, prompt="new size", num_inference_steps=2, seed=5)
    serve(nodes, [again])  # now on the compiled encode and decode
    assert compile_counts(nodes) == counts
    assert [node.num_recompiles() for node in nodes.values()] == [0, 0, 0, 0]


def test_warmup_requests_are_a_generation_and_an_edit_per_configured_size():
    spec = Flux2KleinSpec()
    requests = spec.warmup_requests(ServerConfig(compile_sizes=["1024x1024", "768x1344"]))
    assert [(r.width, r.height, r.reference_sizes) for r in requests] == [
        (1024, 1024, ()),
        (768, 1344, ()),
        (1024, 1024, ((1024, 1024),) * WARMUP_NUM_REFERENCES),
        (768, 1344, ((768, 1344),) * WARMUP_NUM_REFERENCES),
    ]
    assert (
        spec.first_walk(requests[2]) == "encode_text" and spec.next_walk(requests[2], "encode_text") == "edit"
    )
    inputs = spec.warmup_inputs(requests[3])
    assert sorted(inputs) == [reference_image_input(i) for i in range(WARMUP_NUM_REFERENCES)]
    for image in inputs.values():
        assert image.dtype == np.uint8 and image.shape == (1344, 768, 3) and image.std() > 0
    assert spec.warmup_inputs(requests[0]) == {}
    default = spec.warmup_requests(ServerConfig())
    assert [(r.width, r.reference_sizes) for r in default] == [(1024, ()), (1024, ((1024, 1024),) * 2)]
    assert spec.warmup_requests(ServerConfig(warmup=False)) == []


def test_no_warmup_edit_where_the_pipeline_would_refuse_the_size_as_a_reference():
    spec = Flux2KleinSpec()
    requests = spec.warmup_requests(ServerConfig(compile_sizes=["64x1024"]))  # 16:1, beyond 8:1
    assert [(r.width, r.height, r.reference_sizes) for r in requests] == [(64, 1024, ())]


def test_the_runtime_boots_through_a_warmup_edit_with_its_reference_images(tiny_folder, caplog):
    """The warmup edit's images travel as a user's do (conductor -> vae_encoder's worker); a warmup
    request that failed would fail the boot."""
    import asyncio
    import logging

    from mstar.runtime.runtime import Runtime
    from tests.models.flux2_klein.tiny_parts import TINY_SPEC_PATH

    config = ServerConfig(
        model=TINY_SPEC_PATH, model_path=str(tiny_folder[0]), compile_mode="off", warmup=True,
        compile_sizes=[f"{SIZE}x{SIZE}"],
    )  # fmt: skip
    runtime = Runtime(config, TinyFlux2KleinSpec())
    loop = asyncio.new_event_loop()
    caplog.set_level(logging.INFO, logger="mstar.runtime")
    try:
        loop.run_until_complete(asyncio.wait_for(runtime.start(), HANG_GUARD_S))
        assert runtime.ready
    finally:
        loop.run_until_complete(asyncio.wait_for(runtime.shutdown(timeout_s=5.0), HANG_GUARD_S))
        loop.close()
    done = [record.getMessage() for record in caplog.records if "warmup request" in record.getMessage()]
    assert any(message.startswith("warmup request 2/2 done") for message in done), done
