"""Our LTX-2 prompt path (Gemma 3 via transformers + our text connectors) against LTX2Pipeline's
encode_prompt and diffusers' LTX2TextConnectors, with a tiny Gemma 3 and a Gemma tokenizer built
offline; one prompt per forward, so an embedding does not depend on its batch."""

from dataclasses import replace

import pytest
import torch

from mstar.engine.attention import build_attention
from mstar.models.ltx2.connectors import LTX2TextConnectors
from mstar.models.ltx2.presets import TINY
from mstar.models.ltx2.text_encoder import PromptEncoder, build_gemma3, split_prompt_embeds
from tests.models.ltx2.reference import snr_db
from tests.models.ltx2.tiny_parts import tiny_connectors, tiny_text_encoder, tiny_tokenizer

pytest.importorskip("diffusers")

MIN_SNR_DB = 60.0
MAX_LENGTH = TINY.defaults.max_sequence_length
PROMPTS = ["a robot dancing in the rain", "", "  the cat sings  ", "xyz unknown words, and bytes: é!"]

CONNECTOR_VARIANTS = {
    "ltx2-registers": TINY.connectors,
    "no-registers": replace(
        TINY.connectors,
        video_connector_num_learnable_registers=None,
        audio_connector_num_learnable_registers=None,
    ),
    "ltx2.3-per-modality-gated": replace(
        TINY.connectors,
        per_modality_projections=True,
        video_hidden_dim=24,
        audio_hidden_dim=24,
        video_gated_attn=True,
        audio_gated_attn=True,
        rope_type="interleaved",
        proj_bias=True,
    ),
}


@pytest.fixture(scope="module")
def gemma():
    return tiny_text_encoder()


def _reference(gemma, connectors, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX2Pipeline._get_gemma_prompt_embeds, then the connectors, for one prompt."""
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline(
        scheduler=None, vae=None, audio_vae=None, text_encoder=gemma, tokenizer=tiny_tokenizer(),
        connectors=connectors, transformer=None, vocoder=None,
    )  # fmt: skip
    with torch.no_grad():
        embeds, mask, _, _ = pipe.encode_prompt(
            prompt, do_classifier_free_guidance=False, max_sequence_length=MAX_LENGTH, device="cpu"
        )
        video, audio, connector_mask = connectors(embeds, mask, padding_side="left")
    assert bool(connector_mask.all())  # diffusers hands the DiT every token
    return video[0], audio[0]


@pytest.mark.parametrize("variant", list(CONNECTOR_VARIANTS))
def test_prompt_embeds_match_the_pipeline(gemma, variant):
    config = replace(TINY, connectors=CONNECTOR_VARIANTS[variant])
    theirs = tiny_connectors(config)
    ours = LTX2TextConnectors(config.connectors).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    encoder = PromptEncoder(
        gemma, tiny_tokenizer(), ours, build_attention("torch", "cpu", torch.float32), "cpu", MAX_LENGTH
    )
    embeds = encoder.encode(PROMPTS)
    for prompt, embed in zip(PROMPTS, embeds, strict=True):
        video, audio = split_prompt_embeds(embed, config.connectors.video_dim)
        ref_video, ref_audio = _reference(gemma, theirs, prompt)
        assert video.shape == ref_video.shape == (MAX_LENGTH, config.connectors.video_dim)
        assert audio.shape == ref_audio.shape
        assert snr_db(video, ref_video) >= MIN_SNR_DB and snr_db(audio, ref_audio) >= MIN_SNR_DB
    assert snr_db(embeds[0], embeds[1]) < 20  # prompts differ


def test_an_embedding_does_not_depend_on_its_batch(gemma):
    connectors = LTX2TextConnectors(TINY.connectors).eval()
    connectors.load_state_dict(tiny_connectors().state_dict())
    encoder = PromptEncoder(
        gemma, tiny_tokenizer(), connectors, build_attention("torch", "cpu", torch.float32), "cpu", MAX_LENGTH
    )
    together = encoder.encode(PROMPTS)
    for prompt, embed in zip(PROMPTS, together, strict=True):
        assert torch.equal(encoder.encode([prompt])[0], embed)


def test_the_language_model_alone_loads_from_a_saved_folder(gemma, tmp_path):
    """build_gemma3 keeps only what the prompt path runs; its states are the full model's."""
    gemma.save_pretrained(tmp_path / "text_encoder")
    language_model = build_gemma3({}, "cpu", torch.float32, path=str(tmp_path / "text_encoder"))
    assert not hasattr(language_model, "vision_tower")
    connectors = LTX2TextConnectors(TINY.connectors).eval()
    connectors.load_state_dict(tiny_connectors().state_dict())
    attention = build_attention("torch", "cpu", torch.float32)
    full = PromptEncoder(gemma, tiny_tokenizer(), connectors, attention, "cpu", MAX_LENGTH)
    alone = PromptEncoder(language_model, tiny_tokenizer(), connectors, attention, "cpu", MAX_LENGTH)
    for prompt in PROMPTS[:2]:
        assert torch.equal(full.encode_one(prompt), alone.encode_one(prompt))


def test_random_weights_build_from_a_config():
    from tests.models.ltx2.tiny_parts import tiny_gemma_config

    model = build_gemma3(tiny_gemma_config().to_dict(), "cpu", torch.float32, seed=3)
    assert model.config.num_hidden_layers == TINY.connectors.text_proj_in_factor - 1
