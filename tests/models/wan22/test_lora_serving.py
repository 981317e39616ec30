"""Per-request LoRA through Wan2.2's served nodes (tiny folder, CPU) against diffusers' WanPipeline
with load_lora_weights + set_adapters: requests with different adapters and one with none share
each packed step; the one with none is byte-identical to a server without lora_dir."""

import time

import numpy as np
import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext, GenerationParams, RequestState
from mstar.models.wan22.model import Wan22Spec
from mstar.params import LoraChoice
from tests.lora_files import linear_names, save_peft_adapter, write_adapter
from tests.models.wan22.test_pipeline import _generate, _psnr_db, checkpoint  # noqa: F401

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("peft")

MIN_PSNR_DB = 40.0
READY_TIMEOUT_S = 60.0  # a hang guard: tiny adapters load in milliseconds
PROMPT, NEGATIVE = "a tiny red fox runs", "blurry"
SIZE = {"width": 32, "height": 48, "num_frames": 5, "num_inference_steps": 3, "guidance_scale": 5.0}
CHOICES = {"r0": [("a", 0.8)], "r1": [("b", -0.6)], "r2": [("c", 1.0), ("a", 0.3)], "r3": []}


@pytest.fixture(scope="module")
def lora_dir(checkpoint, tmp_path_factory):  # noqa: F811
    """Three adapters on the transformer's Linears (the timestep embedder takes none here)."""
    config, _, pipe = checkpoint
    folder = tmp_path_factory.mktemp("wan-lora-dir")
    model = diffusers.WanTransformer3DModel(**config.dit.to_dict()).eval()
    names = [n for n in linear_names(model) if "time_" not in n]
    mixin = diffusers.loaders.WanLoraLoaderMixin
    paths = {
        "a": save_peft_adapter(model, mixin, folder, "a", names, seed=1),
        "b": save_peft_adapter(model, mixin, folder, "b", [n for n in names if "attn" in n], seed=2, r=8),
        "c": save_peft_adapter(model, mixin, folder, "c", [n for n in names if "ffn" in n], seed=3, r=2),
    }
    return folder, paths


def _build(config, folder, lora_dir=None, max_loras=4):
    spec = Wan22Spec(config)
    server = ServerConfig(lora_dir=None if lora_dir is None else str(lora_dir), max_loras=max_loras)
    ctx = BuildContext(config=server, device="cpu", node_names=spec.node_names, model_path=str(folder))
    return spec, spec.build_nodes(ctx)


def _requests(spec, choices: dict[str, list[tuple[str, float]]], seed=42) -> list[RequestState]:
    requests = []
    for index, (rid, adapters) in enumerate(choices.items()):
        lora = tuple(LoraChoice(name, scale) for name, scale in adapters)
        params = GenerationParams(prompt=PROMPT, negative_prompt=NEGATIVE, seed=seed + index, **SIZE)
        params = spec.validate(params)
        requests.append(RequestState(rid, type(params)(**{**_fields(params), "lora": lora})))
    return requests


def _fields(params):
    return {name: getattr(params, name) for name in params.__struct_fields__}


class _WaitingDit:
    """The dit node as the step loop drives it: a request rides only once its adapters are ready."""

    def __init__(self, node):
        self.node = node

    def __getattr__(self, name):
        return getattr(self.node, name)

    def forward(self, batch):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(self.node.ready(r) for r in batch):
            assert time.monotonic() < deadline, "adapters never became ready"
            time.sleep(0.01)
        self.node.forward(batch)


def _serve(spec, nodes, requests):
    nodes = {**nodes, "dit": _WaitingDit(nodes["dit"])}
    return dict(zip([r.request_id for r in requests], _generate(spec, nodes, requests), strict=True))


def _diffusers(pipe, paths, config, adapters, seed):
    if adapters:
        pipe.enable_lora()
        pipe.set_adapters([n for n, _ in adapters], [s for _, s in adapters])
    else:
        pipe.disable_lora()
    with torch.no_grad():
        return pipe(
            prompt=PROMPT, negative_prompt=NEGATIVE, height=SIZE["height"], width=SIZE["width"],
            num_frames=SIZE["num_frames"], num_inference_steps=SIZE["num_inference_steps"],
            guidance_scale=SIZE["guidance_scale"], generator=torch.Generator("cpu").manual_seed(seed),
            output_type="np", max_sequence_length=config.max_text_tokens,
        ).frames[0]  # fmt: skip


def test_four_requests_three_adapters_and_none_share_steps(checkpoint, lora_dir):  # noqa: F811
    config, folder, pipe = checkpoint
    adapters_folder, paths = lora_dir
    spec, nodes = _build(config, folder, adapters_folder)
    ours = _serve(spec, nodes, _requests(spec, CHOICES))
    _, plain_nodes = _build(config, folder)
    plain = _serve(spec, plain_nodes, _requests(spec, dict.fromkeys(CHOICES, [])))
    assert np.array_equal(ours["r3"], plain["r3"]), "no adapter: the bytes of a server without lora_dir"
    for name, path in paths.items():
        pipe.load_lora_weights(path, adapter_name=name)
    try:
        for index, (rid, adapters) in enumerate(CHOICES.items()):
            theirs = _diffusers(pipe, paths, config, adapters, seed=42 + index)
            assert _psnr_db(ours[rid] / 255.0, theirs) >= MIN_PSNR_DB, rid
            if adapters:
                assert not np.array_equal(ours[rid], plain[rid]), f"{rid}: its adapters changed nothing"
    finally:
        pipe.unload_lora_weights()


def test_evicted_adapters_leave_the_base_output(checkpoint, lora_dir):  # noqa: F811
    """Two slots, three adapters one after another: loads evict; a request without adapters after
    them is byte-identical to a server without lora_dir."""
    config, folder, _ = checkpoint
    adapters_folder, _ = lora_dir
    spec, nodes = _build(config, folder, adapters_folder, max_loras=2)
    for rid, adapters in [("x0", [("a", 1.0)]), ("x1", [("b", 1.0)]), ("x2", [("c", 1.0)])]:
        _serve(spec, nodes, _requests(spec, {rid: adapters}))
    assert nodes["dit"].lora.store.stats.evictions >= 1
    after = _serve(spec, nodes, _requests(spec, {"base": []}))["base"]
    _, plain_nodes = _build(config, folder)
    assert np.array_equal(after, _serve(spec, plain_nodes, _requests(spec, {"base": []}))["base"])


def test_corrupt_adapter_fails_its_request_alone(checkpoint, lora_dir, tmp_path):  # noqa: F811
    """An adapter whose header reads fine but whose tensors fit no module of this model: its
    request's readiness raises the reason; another request with a good adapter goes on."""
    config, folder, _ = checkpoint
    adapters_folder, paths = lora_dir
    import shutil

    shutil.copytree(adapters_folder, tmp_path / "loras")
    write_adapter(
        str(tmp_path / "loras" / "wrong.safetensors"),
        {
            "transformer.blocks.0.attn1.to_q.lora_A.weight": torch.randn(4, 7),
            "transformer.blocks.0.attn1.to_q.lora_B.weight": torch.randn(5, 4),
        },
    )
    spec, nodes = _build(config, folder, tmp_path / "loras")
    dit = nodes["dit"]
    bad, good = _requests(spec, {"bad": [("wrong", 1.0)], "good": [("a", 1.0)]})
    text = nodes["text_encoder"]
    for request in (bad, good):
        text.prepare(request)
        text.forward([request])
        dit.prepare(request)
    deadline = time.monotonic() + READY_TIMEOUT_S
    with pytest.raises(RuntimeError, match="wrong.*(another model size|7)"):
        while not dit.ready(bad):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    dit.release(bad)
    while not dit.ready(good):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    dit.forward([good])  # one step with its adapter
    dit.release(good)
