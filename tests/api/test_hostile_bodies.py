"""Bodies built to break the JSON parser (deep nesting, numbers past Python's 4300-digit limit)
get 400 invalid_json on every POST route, never a 500."""

from __future__ import annotations

import json

import pytest

from mstar.api.errors import ApiError
from mstar.api.json_body import MAX_JSON_DEPTH, nesting_depth_exceeds, parse_json_object
from tests.api.conftest import build_client
from tests.api.fakes import FakeImageSpec, FakeVideoSpec

HUGE_INT = b"9" * 5000  # past Python's int-from-string limit of 4300 digits
HOSTILE_BODIES = {
    "deep-arrays": b"[" * 100_000 + b"]" * 100_000,
    "deep-objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "deep-in-a-field": b'{"prompt": "x", "seed": ' + b"[" * 5_000 + b"]" * 5_000 + b"}",
    "huge-int-seed": b'{"prompt": "x", "seed": ' + HUGE_INT + b"}",
    "huge-int-unknown-field": b'{"prompt": "x", "xyz": -' + HUGE_INT + b"}",
    "huge-float": b'{"prompt": "x", "guidance_scale": 1.' + HUGE_INT + b"}",
    # no UTF-8 form: the text encoders' tokenizers raise TypeError on the string it makes
    "lone-surrogate-prompt": b'{"prompt": "a \\ud800 7"}',
    "lone-surrogate-key": b'{"prompt": "a 7", "\\udfff": 1}',
    "lone-surrogate-long-number-path": b'{"prompt": "\\udc00", "p": "' + b"7" * 100 + b'"}',
}
ROUTES = [("image", "/v1/images/generations"), ("image", "/generate"), ("video", "/v1/videos")]


@pytest.fixture(scope="module")
def clients():
    image_client, image_runtime = build_client(FakeImageSpec())
    video_client, video_runtime = build_client(FakeVideoSpec())
    with image_client, video_client:
        yield {"image": (image_client, image_runtime), "video": (video_client, video_runtime)}


@pytest.mark.parametrize(("kind", "path"), ROUTES, ids=[path for _, path in ROUTES])
@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_json_is_400_invalid_json(clients, kind, path, name):
    client, runtime = clients[kind]
    num_submitted = len(runtime.submitted)
    response = client.post(path, content=HOSTILE_BODIES[name], headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["code"] == "invalid_json"
    assert len(runtime.submitted) == num_submitted
    valid = {"prompt": "a 7", "num_inference_steps": 1}
    assert client.post(path, json=valid).status_code == 200


def test_nesting_up_to_the_bound_parses_and_brackets_in_strings_are_text():
    nested = b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert parse_json_object(nested)["a"] is not None
    assert not nesting_depth_exceeds(b'{"p": "' + b"[{" * 1000 + b'\\" ["}', MAX_JSON_DEPTH)
    assert nesting_depth_exceeds(b'{"p": "\\"", "q": ' + b"[" * 40 + b"]" * 40 + b"}", MAX_JSON_DEPTH)
    big_but_shallow = b'{"p": [' + b"[1]," * 100_000 + b"[2]]}"
    assert len(parse_json_object(big_but_shallow)["p"]) == 100_001
    assert parse_json_object(b'{"seed": -9223372036854775808, "g": 3.141592653589793e-10}')["seed"] < 0


def test_the_number_bound_holds_however_the_body_is_parsed():
    """A body with no long run of number characters parses without the per-number check; one with a
    run (a long number, or digits in a string) takes the checked parse: same values, same errors."""
    longest = b"1" * 64
    assert parse_json_object(b'{"a": ' + longest + b"}")["a"] == int(longest)
    with pytest.raises(ApiError, match="more than 64 characters"):
        parse_json_object(b'{"a": ' + longest + b"1}")
    with pytest.raises(ApiError, match="more than 64 characters"):
        parse_json_object(b'{"a": -1.5e' + b"0" * 70 + b"}")
    digits_in_text = parse_json_object(b'{"p": "' + b"7" * 100 + b'", "n": [1, -2.5e3, 3]}')
    assert digits_in_text == {"p": "7" * 100, "n": [1, -2500.0, 3]}
    ids = list(range(0, 300_000, 97))
    assert parse_json_object(json.dumps({"prompt": ids, "t": 0.7}).encode()) == {"prompt": ids, "t": 0.7}


BODIES_JSON_LOADS_TAKES = [
    b'{"a": 1, "a": 2, "b": [true, null, -0.0, 1E+2, 18446744073709551616]}',
    b'{"s": "\\u00e9\\ud83d\\ude00 \\" \\\\ \\n", "\\u0000": {}}',
    b'{"t": NaN, "u": -Infinity}',  # refused by msgspec, taken by json.loads as before
    b'{"f": 1e400, "g": 0.1000000000000000055511151231257827}',
]
BODIES_BOTH_REFUSE = [
    b'{"a": "x\ny"}',
    b'{"a": 01}',
    b'{"a": .5}',
    b"{}x",
    b'{"a": "\\x"}',
    b"\xef\xbb\xbf{}",
]


def test_every_body_means_what_json_loads_makes_of_it():
    """The fast decoder and json.loads agree: the same values, NaN and the rest through json.loads
    (so the schema names the field), and what json.loads refuses is a 400."""
    for raw in BODIES_JSON_LOADS_TAKES:
        expected = json.loads(raw.decode())
        assert repr(parse_json_object(raw)) == repr(expected)  # repr: NaN != NaN
    for raw in BODIES_BOTH_REFUSE:
        with pytest.raises(ValueError):
            json.loads(raw.decode("utf-8"))
        with pytest.raises(ApiError, match="not valid JSON"):
            parse_json_object(raw)


def test_a_lone_surrogate_is_refused_and_a_surrogate_pair_is_text():
    assert parse_json_object(b'{"s": "\\ud83d\\ude00", "t": NaN}')["s"] == "\U0001f600"
    for raw in (b'{"s": "\\ud800"}', b'{"s": ["x", {"k": "\\ude00"}], "t": NaN}', b'{"s": "\\ud83d"}'):
        with pytest.raises(ApiError, match="lone UTF-16 surrogate"):
            parse_json_object(raw)


def test_a_token_id_prompt_validates_as_the_union_would():
    """A list of plain ints skips the union's member-by-member tries; everything else (booleans,
    floats, mixed lists, batches) meets the union, with the error it always gave."""
    from pydantic import ValidationError

    from mstar.api.errors import validation_error
    from mstar.api.text_schemas import CompletionRequest

    assert CompletionRequest.model_validate({"prompt": [5, 2**70, 0]}).prompt == [5, 2**70, 0]
    assert CompletionRequest.model_validate({"prompt": [1.0, 2]}).prompt == [1, 2]
    assert CompletionRequest.model_validate({"prompt": ["1", "2"]}).prompt == ["1", "2"]
    assert CompletionRequest.model_validate({"prompt": [[1], [2, 3]]}).prompts() == [[1], [2, 3]]
    for bad in ([1, True], [True], [1.5], [[1, True]], [None]):
        with pytest.raises(ValidationError) as raised:
            CompletionRequest.model_validate({"prompt": bad})
        assert validation_error(raised.value.errors()).param == "prompt.str"


def test_a_token_id_outside_the_vocabulary_is_named():
    from mstar.errors import InvalidParam
    from mstar.llm.frontend import TextFrontend
    from mstar.llm.tokenizer import ByteTokenizer

    class Spec:
        def load_tokenizer(self, config):
            return ByteTokenizer(512)

        def context_length(self, config):
            return 4096

    frontend = TextFrontend(Spec(), None)
    ids = [0, 511, 7]
    assert frontend.completion_prompt(ids) == ids and frontend.completion_prompt(ids) is not ids
    with pytest.raises(InvalidParam, match="token id True is outside"):
        frontend.completion_prompt([1, True])
    for bad, first in (([3, 512, -1], 512), ([3, -1, 512], -1)):
        with pytest.raises(InvalidParam, match=f"token id {first} is outside the vocabulary"):
            frontend.completion_prompt(bad)
