"""Our Wan nodes against WanPipeline, both loaded from one tiny folder that holds a real T5 tokenizer
(a `tokenizers` Unigram model saved as tokenizer/): the pipeline pads every prompt to
max_sequence_length and masks the padding; ours must give the same embeddings, latents and frames."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from mstar.bench.parity import case_rows, with_default_steps
from mstar.models.wan22.config import Wan22Config
from mstar.models.wan22.nodes import load_config
from tests.folders import TinyFolder

pytest.importorskip("diffusers")

MODEL = "wan2.2-ti2v-5b"
PROMPTS = [
    "a tiny red fox runs",
    "",
    "  A fox &amp;amp; a  dog\n in the snow  ",  # the pipeline's cleaning: HTML unescaped twice, spaces
    "Xylophones quickly! " * 8,  # past max_sequence_length: truncated, EOS kept last
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> TinyFolder:
    return TinyFolder.write(MODEL, tmp_path_factory.mktemp("wan_folder"))


def test_the_pipeline_loads_a_t5_tokenizer_and_pads_to_max_length(folder):
    index = json.loads((folder.path / "model_index.json").read_text())
    assert index["tokenizer"][0] == "transformers" and index["tokenizer"][1].startswith("T5Tokenizer")
    tokenizer, max_length = folder.reference.tokenizer, folder.family.spec.config.max_text_tokens
    batch = tokenizer(
        ["a tiny red fox runs"], padding="max_length", max_length=max_length, return_tensors="pt"
    )
    num_tokens = int(batch.attention_mask.sum())
    ids = batch.input_ids[0]
    assert ids.shape == (max_length,) and 2 < num_tokens < max_length
    assert (
        ids[num_tokens - 1] == tokenizer.eos_token_id and (ids[num_tokens:] == tokenizer.pad_token_id).all()
    )
    ours = folder.nodes["text_encoder"].pipeline.text_encoder.tokenize("a tiny red fox runs")[0]
    assert ours.tolist() == ids[:num_tokens].tolist()  # the pipeline's ids without its padding


@pytest.mark.parametrize("prompt", PROMPTS, ids=["short", "empty", "html", "truncated"])
def test_prompt_embeddings_are_the_pipelines(folder, prompt):
    with torch.inference_mode():
        theirs = folder.encode_reference(prompt)
        ours = folder.encode_ours(prompt)
    assert ours.shape == theirs.shape and ours.shape[0] >= 1
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_in_bf16_our_prompt_embeddings_are_the_pipelines_bytes(folder):
    """The pipeline pads to max_sequence_length and masks; ours pads to the length bucket and masks
    the same way (here the two lengths agree). An unpadded run is the same in exact arithmetic but
    rounds differently in bf16, by about as much as the pipeline's own kernel noise."""
    from diffusers import WanPipeline
    from transformers import UMT5EncoderModel

    from mstar.models.wan22.parity import wan_prompt_embeds
    from mstar.models.wan22.text_encoder import UMT5PromptEncoder as PromptEncoder
    from mstar.models.wan22.text_encoder import build_umt5

    max_length = folder.family.spec.config.max_text_tokens
    reference = folder.reference
    text_encoder = UMT5EncoderModel.from_pretrained(folder.path / "text_encoder", dtype=torch.bfloat16)
    pipe = WanPipeline(
        tokenizer=reference.tokenizer, text_encoder=text_encoder.eval(), transformer=reference.transformer,
        vae=reference.vae, scheduler=reference.scheduler, expand_timesteps=True,
    )  # fmt: skip
    config = load_config(str(folder.path), folder.family.spec.config)
    model = build_umt5(config.text_encoder, "cpu", torch.bfloat16, folder=str(folder.path / "text_encoder"))
    ours = PromptEncoder(model, reference.tokenizer, "cpu", max_length)
    with torch.inference_mode():  # as inside the pipeline's call (kernels differ under autograd)
        for prompt in PROMPTS:
            theirs = wan_prompt_embeds(pipe, prompt, max_length)
            assert torch.equal(ours.encode([prompt])[0], theirs), prompt


@pytest.mark.parametrize("variant", ["t2v", "i2v"])
def test_latents_and_frames_are_the_pipelines(folder, variant):
    """One step without guidance and two with the default guidance, as the parity harness runs them."""
    family = folder.with_variant(variant).family
    for case in with_default_steps(family.cases, 2):
        latents, frames = case_rows(family, folder.reference, folder.nodes, case, "cpu")
        assert latents["ours"] <= 1e-4, (case, latents)
        assert frames["ours"] >= 40.0, (case, frames)


def _configs_only(source, target):
    """The folder's JSON files alone (load_config reads nothing else)."""
    for path in source.rglob("*.json"):
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, destination)
    return target


def test_the_schedule_comes_from_the_folders_scheduler_config(folder, tmp_path):
    configs = _configs_only(folder.path, tmp_path / "configs")
    scheduler_json = configs / "scheduler" / "scheduler_config.json"
    settings = json.loads(scheduler_json.read_text())
    assert load_config(str(configs), Wan22Config()).scheduler.flow_shift == settings["flow_shift"]

    scheduler_json.write_text(json.dumps(settings | {"flow_shift": 3.0, "solver_order": 3}))
    scheduler = load_config(str(configs), Wan22Config()).scheduler
    assert (scheduler.flow_shift, scheduler.solver_order) == (3.0, 3)

    scheduler_json.write_text(json.dumps(settings | {"prediction_type": "epsilon"}))
    with pytest.raises(ValueError, match="prediction_type"):
        load_config(str(configs), Wan22Config())
