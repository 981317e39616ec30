"""tiny-chat's tokenizer, built offline: a small byte-level BPE (the `tokenizers` library) with
Qwen's ChatML markers and a chat template, saved in transformers' layout.

Digits are split one by one before the merges, so a number is always its digits (the model does
arithmetic on them); words of the questions and the chat roles merge into single tokens.
"""

from __future__ import annotations

from pathlib import Path

from mstar.models.tiny_chat.data import QUESTION_TEMPLATES, problems

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
VOCAB_SIZE = 384  # 256 bytes, 3 specials, the rest merges
# ChatML, as Qwen renders it (system turns included); content is plain text
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def corpus(num_problems: int = 4000, seed: int = 1234) -> list[str]:
    """Rendered conversations for the merges (chat roles, question words, replies)."""
    texts = [f"{IM_START}system\nYou are a calculator.{IM_END}\n"]
    for problem in problems(num_problems, seed):
        texts.append(
            f"{IM_START}user\n{problem.question()}{IM_END}\n{IM_START}assistant\n{problem.reply()}{IM_END}\n"
        )
    texts.extend(QUESTION_TEMPLATES)
    return texts


def build_tokenizer():
    """The transformers tokenizer (PreTrainedTokenizerFast) with its chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        model_max_length=256,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def save_tokenizer(tokenizer, folder: Path) -> None:
    """transformers' files, readable by transformers 4.x too: the generic fast-tokenizer class
    name and the chat template inside tokenizer_config.json (5.x also writes chat_template.jinja)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
