"""Cosmos3's text side as diffusers' Cosmos3OmniPipeline does it: no text encoder, the prompt's
token ids go straight into the understanding pathway.

    tokenizer = load_tokenizer(folder)                      # folder/text_tokenizer (AutoTokenizer)
    ids = prompt_token_ids(tokenizer, PromptRequest("a robot arm", num_frames=121, height=480,
                                                    width=832, fps=24.0), use_system_prompt=False)
    ids.cond, ids.uncond                                    # one token list per guidance label

The prompt gets metadata sentences appended (duration and fps for videos, resolution always); the
negative prompt ("" when absent) gets the inverse sentences. Each is chat-formatted (an optional
system turn naming the task, then the user turn, then the assistant's opening) and followed by the
tokenizer's end-of-text and <|vision_start|>. One prompt per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

VISION_START_TOKEN = "<|vision_start|>"
# The pipeline's system prompts (their wording, "a give prompt" included, is what was trained on).
SYSTEM_PROMPT_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."
DURATION_TEMPLATE = "The video is {duration:.1f} seconds long and is of {fps:.0f} FPS."
INVERSE_DURATION_TEMPLATE = "The video is not {duration:.1f} seconds long and is not of {fps:.0f} FPS."
RESOLUTION_TEMPLATE = "This {kind} is of {height}x{width} resolution."
INVERSE_RESOLUTION_TEMPLATE = "This {kind} is not of {height}x{width} resolution."


@dataclass(frozen=True)
class PromptRequest:
    """What the text side reads of a request."""

    prompt: str
    num_frames: int
    height: int
    width: int
    fps: float = 24.0
    negative_prompt: str | None = None
    add_resolution_template: bool = True
    add_duration_template: bool = True

    @property
    def is_image(self) -> bool:
        return self.num_frames == 1


@dataclass(frozen=True)
class PromptIds:
    cond: list[int]
    uncond: list[int]


def load_tokenizer(folder: str | Path) -> Any:
    """The folder's text_tokenizer, as the pipeline loads it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(folder) / "text_tokenizer"))


def _append_sentence(base: str, addition: str) -> str:
    base = base.rstrip(".")
    return f"{base}. {addition}" if base else addition


def augmented_text(request: PromptRequest, negative: bool) -> str:
    """The prompt (or negative prompt) with the metadata sentences the model was trained with."""
    text = (request.negative_prompt or "") if negative else request.prompt
    if not request.is_image and request.add_duration_template:
        template = INVERSE_DURATION_TEMPLATE if negative else DURATION_TEMPLATE
        text = _append_sentence(
            text, template.format(duration=request.num_frames / request.fps, fps=request.fps)
        )
    if request.add_resolution_template:
        template = INVERSE_RESOLUTION_TEMPLATE if negative else RESOLUTION_TEMPLATE
        kind = "image" if request.is_image else "video"
        text = _append_sentence(text, template.format(kind=kind, height=request.height, width=request.width))
    return text


def chat_token_ids(tokenizer: Any, text: str, is_image: bool, use_system_prompt: bool) -> list[int]:
    """One chat-formatted text -> its ids, ending with end-of-text and <|vision_start|>."""
    conversation = []
    if use_system_prompt:
        system = SYSTEM_PROMPT_IMAGE if is_image else SYSTEM_PROMPT_VIDEO
        conversation.append({"role": "system", "content": system})
    conversation.append({"role": "user", "content": text})
    encoded = tokenizer.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=True, add_vision_id=False, return_dict=True
    )
    # end of text, then the start of the vision tokens (geometry.NUM_PROMPT_SUFFIX_TOKENS)
    suffix = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)]
    return [int(i) for i in encoded["input_ids"]] + [int(i) for i in suffix]


def prompt_token_ids(tokenizer: Any, request: PromptRequest, use_system_prompt: bool) -> PromptIds:
    """The token ids of both labels (the uncond ones are only run with guidance)."""
    return PromptIds(
        cond=chat_token_ids(
            tokenizer, augmented_text(request, negative=False), request.is_image, use_system_prompt
        ),
        uncond=chat_token_ids(
            tokenizer, augmented_text(request, negative=True), request.is_image, use_system_prompt
        ),
    )


SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", VISION_START_TOKEN, "<|vision_end|>")
# A Qwen-style chat template: system and user turns, then the assistant's opening.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def offline_tokenizer() -> Any:
    """A byte-level BPE tokenizer built here, with no files (random-weight serving, tests): one id
    per byte (0-255), then the special tokens, the chat template the pipeline applies. Its ids fit
    every Cosmos3 vocabulary; they are not the published tokenizer's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    alphabet, extra = [], 0
    for byte in range(256):  # GPT-2's byte -> printable character map
        alphabet.append(chr(byte) if byte in printable else chr(256 + extra))
        extra += byte not in printable
    vocab = {char: index for index, char in enumerate(alphabet)}
    for token in SPECIAL_TOKENS:
        vocab[token] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=SPECIAL_TOKENS[0], pad_token=SPECIAL_TOKENS[0],
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
