"""Our Z-Image nodes against ZImagePipeline, both loaded from one tiny folder that holds a real
byte-level Qwen2Tokenizer with Qwen3's chat template: the pipeline renders the template, pads to
max_sequence_length and keeps the masked-in tokens; ours must give the same embeddings, latents
and frames."""

from __future__ import annotations

import json

import pytest
import torch

from mstar.bench.parity import case_rows, with_default_steps
from tests.folders import TinyFolder

pytest.importorskip("diffusers")

MODEL = "z-image-turbo"
PROMPTS = ["a red cube", "", "  two  cats &amp; a dog ", "a lighthouse in a storm " * 40]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> TinyFolder:
    return TinyFolder.write(MODEL, tmp_path_factory.mktemp("zimage_folder"))


def test_the_pipeline_loads_a_qwen_tokenizer_with_the_chat_template(folder):
    index = json.loads((folder.path / "model_index.json").read_text())
    assert index["tokenizer"][0] == "transformers" and index["tokenizer"][1].startswith("Qwen2Tokenizer")
    tokenizer = folder.reference.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "a red cube"}], tokenize=False, add_generation_prompt=True,
        enable_thinking=True,
    )  # fmt: skip
    assert text == "<|im_start|>user\na red cube<|im_end|>\n<|im_start|>assistant\n"
    ours = folder.nodes["text_encoder"].pipeline.text_encoder.tokenize("a red cube")[0]
    assert ours.tolist() == tokenizer([text])["input_ids"][0]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["short", "empty", "spaces", "truncated"])
def test_prompt_embeddings_are_the_pipelines(folder, prompt):
    with torch.inference_mode():
        theirs = folder.encode_reference(prompt)
        ours = folder.encode_ours(prompt)
    assert ours.shape == theirs.shape and ours.shape[0] >= 1
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_latents_and_frames_are_the_pipelines(folder):
    """One step, then two at the default guidance (none), as the parity harness runs them."""
    family = folder.family
    for case in with_default_steps(family.cases, 2):
        latents, frames = case_rows(family, folder.reference, folder.nodes, case, "cpu")
        assert latents["ours"] <= 1e-4, (case, latents)
        assert frames["ours"] >= 40.0, (case, frames)
