"""Incremental detokenization, stop strings held back across steps, and the byte fallback tokenizer."""

from mstar.llm.detokenizer import IncrementalDetokenizer, StopText
from mstar.llm.tokenizer import IM_END, IM_START, ByteTokenizer


def test_multibyte_characters_appear_once_whole():
    tokenizer = ByteTokenizer(512)
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("hi "))
    pieces = [detokenizer.add(b) for b in "é€x".encode()]
    assert "".join(pieces) == "é€x"
    assert pieces[0] == "" and pieces[1] == "é"  # the first byte alone is no character yet


def test_stop_strings_are_cut_and_never_streamed_in_part():
    stop = StopText(["END", "##"])
    sent = [stop.add("abc E"), stop.add("N"), stop.add("D tail")]
    assert "".join(sent) == "abc " and stop.stopped
    assert all("E" not in piece for piece in sent)


def test_held_back_text_comes_out_at_the_end():
    stop = StopText(["STOP"])
    assert stop.add("hello S") == "hell"
    assert stop.finish() == "o S"


def test_no_stop_strings_pass_everything():
    stop = StopText([])
    assert stop.add("abc") == "abc" and stop.finish() == ""


def test_byte_tokenizer_chat_markers_are_special_ids():
    tokenizer = ByteTokenizer(151936)
    text = tokenizer.render_chat([{"role": "user", "content": "2+2?"}], add_generation_prompt=True)
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.special_ids[IM_START] == 151644
    assert tokenizer.special_ids[IM_END] in ids and tokenizer.eos_token_ids[0] == 151645
    assert tokenizer.decode(ids) == "user\n2+2?\nassistant\n"
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
