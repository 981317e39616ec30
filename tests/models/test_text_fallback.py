"""The fallback tokenizer: deterministic ids, HF-style padding, truncation and masks."""

import pytest
import torch

from mstar.models.text_fallback import EOS_ID, PAD_ID, fallback_tokenizer


def test_same_text_same_ids_and_eos_last():
    tokenizer = fallback_tokenizer(vocab_size=1000)
    first = tokenizer("a red fox")
    assert first["input_ids"] == tokenizer("a red fox").input_ids
    assert first["input_ids"][-1] == EOS_ID and len(first["input_ids"]) == len("a red fox") + 1
    assert tokenizer("a red fox").input_ids != tokenizer("a red box").input_ids
    assert all(2 <= i < 1000 for i in first["input_ids"][:-1])


def test_padding_truncation_and_tensors():
    tokenizer = fallback_tokenizer(vocab_size=50)
    batch = tokenizer(
        ["hi", "a much longer prompt"],
        padding="max_length",
        max_length=8,
        truncation=True,
        return_tensors="pt",
    )
    assert batch.input_ids.shape == (2, 8) and batch.input_ids.dtype == torch.int64
    assert batch.attention_mask[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert batch.input_ids[0, 3:].eq(PAD_ID).all()
    assert batch.input_ids[1, -1] == EOS_ID and batch.attention_mask[1].all()
    longest = tokenizer(["hi", "hello"], padding="longest", return_tensors="pt")
    assert longest.input_ids.shape == (2, 6)
    ids = tokenizer("日本", add_special_tokens=False).input_ids
    assert len(ids) == len("日本".encode()) and all(2 <= i < 50 for i in ids)
    with pytest.raises(ValueError):
        tokenizer("x", return_tensors="np")
