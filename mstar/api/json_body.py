"""Request bodies as JSON, with bounds on what a hostile body can make the parser do.

Python's json module recurses once per nesting level (`[[[[...` 100k deep raises RecursionError) and
turns digit strings into ints whatever their length (over 4300 digits raises ValueError; below that
the conversion is quadratic). Both would surface as 500s. Here the nesting depth is checked before
parsing and every number's length while parsing, and any failure is a 400 `invalid_json`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from mstar.api.errors import ApiError

# Request bodies are flat objects with a few small nested ones (input_reference: {image_url}).
MAX_JSON_DEPTH = 32
# Longer than any int64 or float repr (a float's shortest repr is at most 24 characters).
MAX_NUMBER_CHARS = 64
# A JSON string, escapes included, unrolled so long runs of plain characters match in one step.
JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
OPENERS, CLOSERS = b"[{", b"]}"
NOT_BRACKETS = bytes(sorted(set(range(256)) - set(OPENERS + CLOSERS)))
DEPTH_SCAN_CHUNK_BYTES = 1 << 20
# A body whose every run of number characters is at most MAX_NUMBER_CHARS long (nearly all) holds
# no long number, and parses with the C scanner's own int and float; a 2k-token prompt of ids
# would otherwise call the length check 2k times. The runs are found by mapping number characters
# to "0" and the rest to " " (C loops), then looking for a too-long run of "0".
NUMBER_CHARS = b"-+.eE0123456789"
AS_NUMBER_RUNS = bytes(0x30 if byte in NUMBER_CHARS else 0x20 for byte in range(256))
LONG_NUMBER_RUN = b"0" * (MAX_NUMBER_CHARS + 1)
# msgspec's decoder reads a 2k-id prompt about 3x faster than json.loads and gives the same values
# for every body it accepts; it refuses a few that json.loads takes (NaN, Infinity, lone
# surrogates, 1e400), which then go through json.loads, so what a body means never changes.
# A lone UTF-16 surrogate escape (\ud800 alone) has no UTF-8 form: no tokenizer or text encoder
# takes the string it makes (the Rust tokenizers raise TypeError), so such a body is refused here.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class JsonLimitExceeded(ValueError):
    pass


def invalid_json(detail: str = "") -> ApiError:
    message = "The request body is not valid JSON." + (f" {detail}" if detail else "")
    return ApiError(400, message, code="invalid_json")


def nesting_depth_exceeds(raw: bytes, max_depth: int) -> bool:
    """Whether arrays and objects nest deeper than max_depth. Exact for valid UTF-8 JSON, where
    brackets outside strings are structure; for invalid JSON any answer will do (json.loads refuses
    it). Most bodies hold fewer brackets than max_depth and are answered by counting; others are
    scanned with their strings cut out (the brackets in them are text): a running sum of +1 per
    opener and -1 per closer, in chunks so a 32 MB body of brackets needs little memory."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    import numpy as np

    brackets = JSON_STRING.sub(b"", raw).translate(None, NOT_BRACKETS)
    steps = np.zeros(256, dtype=np.int32)
    steps[list(OPENERS)], steps[list(CLOSERS)] = 1, -1
    depth = 0
    for start in range(0, len(brackets), DEPTH_SCAN_CHUNK_BYTES):
        chunk = np.frombuffer(brackets, np.uint8, min(DEPTH_SCAN_CHUNK_BYTES, len(brackets) - start), start)
        running = np.cumsum(steps[chunk]) + depth
        if int(running.max()) > max_depth:
            return True
        depth = int(running[-1])
    return False


def _bounded_number(convert):
    def parse(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise JsonLimitExceeded(f"A number has more than {MAX_NUMBER_CHARS} characters.")
        return convert(text)

    return parse


def _loads(raw: bytes, text: str) -> Any:
    try:
        return msgspec.json.decode(raw)  # refuses lone surrogates itself
    except msgspec.DecodeError:
        return _text_only(json.loads(text))  # what msgspec refuses, json.loads takes or refuses as before


def _text_only(data: Any) -> Any:
    if _holds_lone_surrogate(data):
        raise invalid_json(
            "A string holds a lone UTF-16 surrogate escape (\\ud800 to \\udfff), which is not text."
        )
    return data


def _holds_lone_surrogate(value: Any) -> bool:
    """Whether a string of the parsed body (a key or a value, at any depth) holds a lone surrogate."""
    if isinstance(value, str):
        return LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_holds_lone_surrogate(key) or _holds_lone_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_holds_lone_surrogate(item) for item in value)
    return False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; ApiError 400 `invalid_json` for anything else."""
    if not raw.strip():
        raise ApiError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    if nesting_depth_exceeds(raw, MAX_JSON_DEPTH):
        raise invalid_json(f"Arrays and objects nest deeper than {MAX_JSON_DEPTH} levels.")
    try:
        text = raw.decode("utf-8")  # JSON over HTTP is UTF-8 (RFC 8259), and the scan above assumes it
        if LONG_NUMBER_RUN not in raw.translate(AS_NUMBER_RUNS):
            data = _loads(raw, text)
        else:
            data = json.loads(text, parse_int=_bounded_number(int), parse_float=_bounded_number(float))
            data = _text_only(data)
    except JsonLimitExceeded as error:
        raise invalid_json(str(error)) from None
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise invalid_json() from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    return data
