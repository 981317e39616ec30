"""Real transformers tokenizers built offline (no hub), for diffusers-layout folders written by the
parity harness and the tests: the classes the pipelines load, with small vocabularies.

    umt5_tokenizer(vocab_size=256384)   # T5Tokenizer (Unigram, Metaspace, "</s>" appended): Wan's
    qwen_tokenizer()                    # Qwen2Tokenizer (byte-level BPE) with Qwen3's chat template

Their ids are what the real tokenizers' ids are not (the vocabularies are made up), but everything
around them is the real thing: a Unigram segmentation into words and pieces, EOS handling, padding
to max_length with an attention mask, truncation, chat templates, save_pretrained/from_pretrained.
"""

from __future__ import annotations

import string
from typing import Any

# Frequent English words (prompts' vocabulary): whole-word pieces for the Unigram model.
_WORDS_TEXT = (
    "a an the of in on at to and with from by for under over into near above behind small tiny big "
    "large old young red blue green yellow white black golden silver bright dark soft warm cold wet "
    "fox cat dog bird horse fish ship boat car city street forest river lake sea ocean coast beach "
    "mountain hill snow rain storm wind sun moon star sky cloud light shadow fire water stone tree "
    "flower field garden house tower lighthouse bridge road window door room table book man woman "
    "child girl boy people crowd face eye hand hair run walk fly swim jump sit stand look play dance "
    "is are was over through across slowly quickly gently cinematic shot close wide view camera "
    "motion detailed realistic photo painting style morning evening night dawn dusk winter summer "
    "autumn spring blurry low quality"
)
WORDS = tuple(_WORDS_TEXT.split())
SUFFIXES = ("s", "es", "ed", "ing", "er", "est", "ly", "y", "en")  # word endings, no "▁"
T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2 as in every T5 vocabulary
SPACE = "\u2581"  # sentencepiece's word marker


def umt5_pieces(vocab_size: int) -> list[tuple[str, float]]:
    """(piece, log-probability score) in id order: T5's specials, the word marker, characters with
    and without it, suffixes, whole words; cut to `vocab_size`. Longer pieces score higher, so the
    Unigram model prefers whole words and splits the rest into pieces and characters."""
    pieces: list[str] = [SPACE]
    characters = string.ascii_lowercase + string.digits + ",.!?'-:;()" + string.ascii_uppercase
    pieces += [SPACE + c for c in characters] + list(characters)
    pieces += list(SUFFIXES) + [SPACE + word for word in WORDS]
    seen: set[str] = set()
    unique = [p for p in pieces if not (p in seen or seen.add(p))]
    vocab = [(token, 0.0) for token in T5_SPECIALS]
    vocab += [(piece, -12.0 + 1.5 * len(piece)) for piece in unique]
    if vocab_size < len(T5_SPECIALS) + 1 + len(characters):
        raise ValueError(f"vocab_size {vocab_size} is too small for a character vocabulary")
    return vocab[:vocab_size]


def umt5_tokenizer(vocab_size: int, model_max_length: int = 512) -> Any:
    """A T5Tokenizer like UMT5's: pad 0, EOS 1 appended to every text, unk 2, right padding."""
    from transformers import T5Tokenizer

    return T5Tokenizer(vocab=umt5_pieces(vocab_size), extra_ids=0, model_max_length=model_max_length)


# Renders one user turn exactly as Qwen3's template does with enable_thinking=True.
QWEN3_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    "{% endif %}"
)
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable unicode map (what byte-level BPE vocabularies are written in)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def qwen_tokenizer() -> Any:
    """A byte-level Qwen2Tokenizer (one id per byte, no merges; ids 0-258) with the chat template;
    pads with <|endoftext|> on the right, as Qwen3's tokenizer does."""
    from transformers import Qwen2Tokenizer

    vocab = {char: index for index, char in enumerate(byte_alphabet())}
    for token in QWEN_SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[], additional_special_tokens=list(QWEN_SPECIAL_TOKENS[1:])
    )
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")  # ids 0-4 as in Gemma's vocabulary


def gemma_tokenizer(model_max_length: int = 1024) -> Any:
    """A GemmaTokenizerFast (BPE with byte fallback, "▁" for spaces, <bos> first): the special
    ids, the 256 byte tokens, the letters and the frequent words, merged left to right."""
    from transformers import GemmaTokenizerFast

    vocab = {token: index for index, token in enumerate(GEMMA_SPECIALS)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for char in SPACE + string.ascii_lowercase:
        vocab.setdefault(char, len(vocab))
    merges = []
    for word in (SPACE + w for w in WORDS):
        for end in range(2, len(word) + 1):
            if word[:end] not in vocab:
                merges.append((word[: end - 1], word[end - 1]))
                vocab[word[:end]] = len(vocab)
    tokenizer = GemmaTokenizerFast(vocab=vocab, merges=merges, add_bos_token=True)
    tokenizer.model_max_length = model_max_length
    return tokenizer
