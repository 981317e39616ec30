"""MSTAR_TRACE_TENSORS: per-node, per-step content hashes of a request's tensors, so two runs of the
same request can be compared line by line (a diagnostic for same-seed parity)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

import torch

from mstar.config import ServerConfig
from mstar.graph import RequestState
from mstar.models.wan22.model import WanParams
from mstar.runtime.runtime import Runtime
from mstar.runtime.tensor_trace import TRACE_ENV, TensorTracer, first_divergences, tensor_digest
from tests.runtime.fake_models import FakeParams
from tests.serving.tiny_specs import TINY_WAN_PATH, TinyWanSpec

TIMEOUT_S = 60.0
NUM_STEPS = 3


def test_digest_reads_content_dtype_and_shape():
    values = torch.arange(6, dtype=torch.float32)
    assert tensor_digest(values) == tensor_digest(values.clone())
    assert tensor_digest(values) != tensor_digest(values + 1)
    assert tensor_digest(values) != tensor_digest(values.view(2, 3))
    bf16 = values.to(torch.bfloat16)
    assert tensor_digest(bf16) != tensor_digest(bf16.float())  # numpy has no bfloat16: raw bits
    assert tensor_digest(values[::2]) == tensor_digest(values[::2].contiguous())


def test_a_line_lists_only_tensors_new_since_the_last(tmp_path):
    tracer = TensorTracer(worker=3, out_dir=tmp_path)
    state = RequestState("r1", FakeParams(seed=5), tensors={"a": torch.ones(2)})
    tracer.after_forward("enc", [state])
    state.tensors["b"] = torch.zeros(2)
    tracer.after_forward("enc", [state])
    state.tensors["a"] = torch.full((2,), 2.0)  # replaced: hashed again
    tracer.after_forward("enc", [state])
    lines = [json.loads(line) for line in (tmp_path / "worker3.jsonl").read_text().splitlines()]
    assert [sorted(line["hashes"]) for line in lines] == [["a"], ["b"], ["a"]]
    assert [line["forward"] for line in lines] == [1, 2, 3] and lines[0]["seed"] == 5
    tracer.forget("r1")
    tracer.after_forward("enc", [state])  # a forgotten request starts over
    last = json.loads((tmp_path / "worker3.jsonl").read_text().splitlines()[-1])
    assert last["forward"] == 1 and sorted(last["hashes"]) == ["a", "b"]


def test_off_without_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.delenv(TRACE_ENV, raising=False)
    tracer = TensorTracer.from_env(0)
    assert not tracer.enabled
    tracer.after_forward(
        "enc", [RequestState("r", FakeParams(), tensors={"a": torch.ones(1)})]
    )  # nothing written


async def _run_requests(config: ServerConfig, requests: list[WanParams]) -> None:
    runtime = Runtime(config, TinyWanSpec())
    await runtime.start()
    try:
        for params in requests:  # one at a time, as a user retrying a prompt would
            await asyncio.wait_for(runtime.submit(params).result(), TIMEOUT_S)
    finally:
        await runtime.shutdown(timeout_s=5.0)


def test_same_request_twice_traces_the_same_hashes_at_every_node_and_step(monkeypatch, tmp_path):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path))  # the workers inherit it
    config = ServerConfig(model=TINY_WAN_PATH, random_weights=True, compile_mode="off", warmup=False)
    base = {
        "prompt": "a red fox", "num_inference_steps": NUM_STEPS, "width": 32, "height": 32,
        "num_frames": 5, "fps": 8, "guidance_scale": 4.0, "image_to_video": False,
    }  # fmt: skip
    requests = [WanParams(**base, seed=seed) for seed in (1, 2, 1)]
    asyncio.run(_run_requests(config, requests))
    per_request: dict[str, list[tuple]] = defaultdict(list)
    for path in tmp_path.glob("worker*.jsonl"):
        for line in map(json.loads, path.read_text().splitlines()):
            per_request[line["request_id"]].append((line["node"], line["forward"], line["hashes"]))
    first, other, repeat = (per_request[rid] for rid in sorted(per_request, key=_submit_order(tmp_path)))
    dit_steps = [hashes for node, _, hashes in first if node == "dit"]
    assert len(dit_steps) == NUM_STEPS and all("dit.latents" in hashes for hashes in dit_steps)
    assert {node for node, _, _ in first} >= {"text_encoder", "dit", "vae_decoder"}
    assert repeat == first  # same prompt and seed: the same bytes everywhere
    assert [h for n, _, h in other if n == "dit"][0] != dit_steps[0]  # another seed: other latents
    (report,) = first_divergences(tmp_path)
    assert "seed 1" in report and "identical at every node and step" in report


def test_the_comparison_names_the_first_node_and_step_that_differ(tmp_path):
    tracer = TensorTracer(worker=0, out_dir=tmp_path)
    for request_id, last_step in (("first", 1.0), ("again", 2.0)):
        state = RequestState(request_id, FakeParams(seed=9), tensors={"embeds": torch.ones(2)})
        tracer.after_forward("text_encoder", [state])
        for step in (0.0, last_step):
            state.state["dit"] = {"latents": torch.full((2,), step)}
            tracer.after_forward("dit", [state])
    (report,) = first_divergences(tmp_path)
    assert "again vs first" in report and "dit forward 2: dit.latents" in report


def _submit_order(trace_dir):
    """Request ids in the order their first line was written (the requests ran one at a time)."""
    order: list[str] = []
    for path in sorted(trace_dir.glob("worker*.jsonl")):
        for line in map(json.loads, path.read_text().splitlines()):
            if line["request_id"] not in order:
                order.append(line["request_id"])
    return order.index
