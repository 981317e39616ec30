"""Tokenizer, text encoder, data pipeline and the training attention."""

import numpy as np
import torch

from mstar.engine.attention import AttentionLayout, reference_attention
from mstar.models.tiny_digits import data
from mstar.models.tiny_digits.text import (
    BOS,
    UNK,
    WordTokenizer,
    build_vocab,
    make_text_encoder,
    pad_token_ids,
)
from mstar.models.tiny_digits.train import TrainingAttention


def tokenizer(max_tokens: int = 16) -> WordTokenizer:
    return WordTokenizer(build_vocab(), max_tokens)


def test_every_template_word_and_digit_is_known():
    tok = tokenizer()
    unk = tok.ids[UNK]
    for digit in range(10):
        for template in range(len(data.PROMPT_TEMPLATES)):
            ids = tok.encode(data.prompt_for(digit, template))
            assert ids[0] == tok.ids[BOS]
            assert unk not in ids


def test_unknown_words_map_to_unk_and_case_is_ignored():
    tok = tokenizer()
    assert tok.encode("A Handwritten SEVEN") == tok.encode("a handwritten seven")
    assert tok.encode("a purple 7") == [tok.ids[BOS], tok.ids["a"], tok.ids[UNK], tok.ids["7"]]
    assert tok.encode("") == [tok.ids[BOS]]  # the unconditional prompt is one token, never empty
    assert tok.encode("7, please!") == [tok.ids[BOS], tok.ids["7"], tok.ids[UNK]]


def test_long_prompts_are_truncated():
    assert len(tokenizer(max_tokens=4).encode("one two three four five six")) == 5


def test_vocab_round_trips_through_json(tmp_path):
    tok = tokenizer()
    tok.save(tmp_path / "vocab.json")
    loaded = WordTokenizer.load(tmp_path / "vocab.json", 16)
    assert loaded.encode("the digit seven") == tok.encode("the digit seven")


def test_text_encoder_ignores_padding():
    tok = tokenizer()
    torch.manual_seed(0)
    encoder = make_text_encoder(len(tok.vocab), 32).eval()
    short, long = tok.encode("7"), tok.encode("a drawing of the digit 7")
    ids, mask = pad_token_ids([short, long])
    batched = encoder(ids, mask)  # [2, L, 32]
    alone = encoder(torch.tensor([short]), torch.zeros(1, len(short), dtype=torch.bool))
    assert batched.shape == (2, len(long), 32)
    torch.testing.assert_close(batched[0, : len(short)], alone[0], atol=1e-5, rtol=1e-5)


def test_upscaled_digits_keep_their_class():
    train_split, held_out = data.load_splits()
    classifier = data.train_classifier(train_split)
    pixels = data.upscale_to_model(held_out.images_8px, 16)  # [N, 1, 1, 16, 16]
    assert pixels.shape == (len(held_out.labels), 1, 1, 16, 16)
    assert pixels.min() >= -1 and pixels.max() <= 1
    accuracy = (data.classify(classifier, data.ink_grid_from_model(pixels)) == held_out.labels).mean()
    assert accuracy > 0.97


def test_frames_and_model_pixels_give_the_same_ink_grid():
    from mstar.models.tiny_digits.config import TinyDigitsConfig
    from mstar.models.tiny_digits.pipeline import DigitsPipeline

    _, held_out = data.load_splits()
    pixels = data.upscale_to_model(held_out.images_8px[:5], 16)
    frames = np.concatenate(
        [DigitsPipeline(TinyDigitsConfig(output_size=256), "cpu").decode(p).numpy() for p in pixels]
    )  # [5, 256, 256, 3]
    # bilinear 16 -> 256 then 32x32 averages vs 2x2 averages: equal up to edge blur (ink levels 0..16)
    np.testing.assert_allclose(data.ink_grid_from_frames(frames), data.ink_grid_from_model(pixels), atol=1.25)


def test_training_attention_matches_the_engine_reference():
    layouts = [
        AttentionLayout.self_attention((5, 5, 5)),
        AttentionLayout.cross_attention((5, 5, 5), (2, 4, 1)),
        AttentionLayout.cross_attention((3, 6), (2, 4)),  # ragged queries: falls back to the reference
    ]
    attention = TrainingAttention()
    generator = torch.Generator().manual_seed(0)
    for layout in layouts:
        q = torch.randn(layout.total_q, 2, 8, generator=generator)
        k = torch.randn(layout.total_kv, 2, 8, generator=generator)
        v = torch.randn(layout.total_kv, 2, 8, generator=generator)
        attention.plan("label", layout)
        torch.testing.assert_close(attention.run("label", q, k, v), reference_attention(q, k, v, layout))
