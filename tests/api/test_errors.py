"""Bad inputs, each answered with the right status and an OpenAI-shaped error naming the field; the
server keeps serving a valid request after every one of them."""

from __future__ import annotations

import base64
import io

import pytest

from tests.api.conftest import build_client
from tests.api.fakes import FakeImageSpec, FakeVideoSpec

MAX_BODY_BYTES = 8192
VALID_IMAGE = {"prompt": "a handwritten 7", "num_inference_steps": 1}
VALID_VIDEO = {"prompt": "a cat", "num_inference_steps": 1, "num_frames": 5}
IMAGES = "/v1/images/generations"


def _body(**fields):
    return {"json": {**VALID_IMAGE, **fields}}


def _raw(content: bytes | str, content_type: str = "application/json"):
    return {"content": content, "headers": {"content-type": content_type}}


def _image(width: int, height: int, fmt: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, format=fmt)
    return buffer.getvalue()


def _png(width: int, height: int) -> bytes:
    return _image(width, height, "PNG")


# (id, method, path, request kwargs, status, param, code)
IMAGE_CASES = [
    ("malformed-json", "POST", IMAGES, _raw(b'{"prompt": "x",'), 400, None, "invalid_json"),
    ("json-array", "POST", IMAGES, _raw(b'["prompt"]'), 400, None, "invalid_json"),
    ("empty-body", "POST", IMAGES, _raw(b""), 400, None, "invalid_json"),
    ("not-utf8", "POST", IMAGES, _raw(b"\xff\xfe{"), 400, None, "invalid_json"),
    ("missing-prompt", "POST", IMAGES, {"json": {"n": 1}}, 400, "prompt", "missing"),
    ("prompt-wrong-type", "POST", IMAGES, _body(prompt=123), 400, "prompt", "string_type"),
    ("prompt-blank", "POST", IMAGES, _body(prompt="   "), 400, "prompt", "value_error"),
    ("prompt-too-long-for-model", "POST", IMAGES, _body(prompt="x" * 201), 400, "prompt", "invalid_value"),
    ("n-zero", "POST", IMAGES, _body(n=0), 400, "n", "greater_than_equal"),
    ("n-too-many", "POST", IMAGES, _body(n=11), 400, "n", "less_than_equal"),
    ("n-not-int", "POST", IMAGES, _body(n="abc"), 400, "n", "int_parsing"),
    ("n-boolean", "POST", IMAGES, _body(n=True), 400, "n", "value_error"),
    ("seed-boolean", "POST", IMAGES, _body(seed=False), 400, "seed", "value_error"),
    ("guidance-boolean", "POST", IMAGES, _body(guidance_scale=True), 400, "guidance_scale", "value_error"),
    ("openai-stream-unsupported", "POST", IMAGES, _body(stream=True), 400, "stream", "extra_forbidden"),
    ("n-fraction", "POST", IMAGES, _body(n=2.5), 400, "n", "int_from_float"),
    ("size-garbage", "POST", IMAGES, _body(size="big"), 400, "size", "invalid_value"),
    ("size-negative", "POST", IMAGES, _body(size="-64x64"), 400, "size", "invalid_value"),
    ("width-not-multiple", "POST", IMAGES, _body(size="65x64"), 400, "width", "invalid_value"),
    ("height-too-big", "POST", IMAGES, _body(size="64x1024"), 400, "height", "invalid_value"),
    (
        "response-format",
        "POST",
        IMAGES,
        _body(response_format="gif"),
        400,
        "response_format",
        "literal_error",
    ),
    ("output-format", "POST", IMAGES, _body(output_format="bmp"), 400, "output_format", "literal_error"),
    ("compression-range", "POST", IMAGES, _body(output_compression=101), 400, "output_compression", None),
    ("steps-zero", "POST", IMAGES, _body(num_inference_steps=0), 400, "num_inference_steps", None),
    (
        "steps-over-model",
        "POST",
        IMAGES,
        _body(num_inference_steps=51),
        400,
        "num_inference_steps",
        "invalid_value",
    ),
    ("guidance-negative", "POST", IMAGES, _body(guidance_scale=-1), 400, "guidance_scale", None),
    ("guidance-string", "POST", IMAGES, _body(guidance_scale="high"), 400, "guidance_scale", "float_parsing"),
    (
        "guidance-nan",
        "POST",
        IMAGES,
        _raw(b'{"prompt": "x", "guidance_scale": NaN}'),
        400,
        "guidance_scale",
        None,
    ),
    ("seed-negative", "POST", IMAGES, _body(seed=-1), 400, "seed", None),
    ("seed-over-model", "POST", IMAGES, _body(seed=2**32), 400, "seed", "invalid_value"),
    (
        "unknown-field",
        "POST",
        IMAGES,
        _body(num_inference_step=3),
        400,
        "num_inference_step",
        "extra_forbidden",
    ),
    ("negative-prompt-type", "POST", IMAGES, _body(negative_prompt=["x"]), 400, "negative_prompt", None),
    ("transparent-background", "POST", IMAGES, _body(background="transparent"), 400, "background", None),
    ("unknown-model", "POST", IMAGES, _body(model="sora-2"), 404, "model", "model_not_found"),
    ("content-type", "POST", IMAGES, _raw("prompt=x", "text/plain"), 415, None, "unsupported_media_type"),
    (
        "body-too-large",
        "POST",
        IMAGES,
        _body(prompt="x" * (2 * MAX_BODY_BYTES)),
        413,
        None,
        "request_too_large",
    ),
    ("video-on-image-model", "POST", "/v1/videos", {"json": VALID_VIDEO}, 400, "model", "unsupported_mode"),
    (
        "native-frames-on-image",
        "POST",
        "/generate",
        {"json": {**VALID_IMAGE, "num_frames": 5}},
        400,
        "num_frames",
        None,
    ),
    (
        "native-bad-base64",
        "POST",
        "/generate",
        {"json": {**VALID_IMAGE, "input_reference": "@@@"}},
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "native-reference-garbage",
        "POST",
        "/generate",
        {
            "json": {
                **VALID_IMAGE,
                "input_reference": "data:image/png;base64,"
                + base64.b64encode(b"\x89PNG not really").decode(),
            }
        },
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "native-reference-on-t2i-model",
        "POST",
        "/generate",
        {"json": {**VALID_IMAGE, "input_reference": base64.b64encode(_png(8, 8)).decode()}},
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "native-remote-url",
        "POST",
        "/generate",
        {"json": {**VALID_IMAGE, "input_reference": {"image_url": "http://169.254.169.254/"}}},
        400,
        "input_reference.image_url",
        "invalid_value",
    ),
    ("unknown-video", "GET", "/v1/videos/video_nope", {}, 404, "video_id", "not_found"),
    ("list-limit-zero", "GET", "/v1/videos?limit=0", {}, 400, "limit", None),
    ("list-bad-order", "GET", "/v1/videos?order=up", {}, 400, "order", None),
    ("unknown-route", "GET", "/v1/nothing", {}, 404, None, "not_found"),
    ("wrong-method", "GET", IMAGES, {}, 405, None, "method_not_allowed"),
    ("unknown-model-card", "GET", "/v1/models/nope", {}, 404, "model", "model_not_found"),
]


VIDEO_CASES = [
    (
        "frames-not-4k1",
        "POST",
        "/v1/videos",
        {"json": {**VALID_VIDEO, "num_frames": 10}},
        400,
        "num_frames",
        None,
    ),
    (
        "seconds-text",
        "POST",
        "/v1/videos",
        {"json": {**VALID_VIDEO, "seconds": "four"}},
        400,
        "seconds",
        None,
    ),
    (
        "seconds-negative",
        "POST",
        "/v1/videos",
        {"json": {**VALID_VIDEO, "seconds": "-4"}},
        400,
        "seconds",
        None,
    ),
    ("seconds-bool", "POST", "/v1/videos", {"json": {**VALID_VIDEO, "seconds": True}}, 400, "seconds", None),
    ("fps-zero", "POST", "/v1/videos", {"json": {**VALID_VIDEO, "fps": 0}}, 400, "fps", None),
    ("multipart-fps-text", "POST", "/v1/videos", {"data": {"prompt": "x", "fps": "fast"}}, 400, "fps", None),
    (
        "reference-not-image",
        "POST",
        "/v1/videos",
        {"data": {"prompt": "x"}, "files": {"input_reference": ("a.png", b"not an image", "image/png")}},
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "reference-bmp",  # an image Pillow can read, in a format the API does not take
        "POST",
        "/v1/videos",
        {"data": {"prompt": "x"}, "files": {"input_reference": ("a.bmp", _image(8, 8, "BMP"), "image/bmp")}},
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "reference-empty",
        "POST",
        "/v1/videos",
        {"data": {"prompt": "x"}, "files": {"input_reference": ("a.png", b"", "image/png")}},
        400,
        "input_reference",
        "invalid_value",
    ),
    (
        "file-id-reference",
        "POST",
        "/v1/videos",
        {"json": {**VALID_VIDEO, "input_reference": {"file_id": "f"}}},
        400,
        "input_reference.file_id",
        None,
    ),
    ("image-on-video-model", "POST", IMAGES, {"json": VALID_IMAGE}, 400, "model", "unsupported_mode"),
    (
        "native-output-format-video",
        "POST",
        "/generate",
        {"json": {**VALID_VIDEO, "output_format": "png"}},
        400,
        "output_format",
        None,
    ),
]


def _assert_error_shape(response, status, param, code):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert param.split(".")[0] in error["message"] or status == 404


@pytest.fixture(scope="module")
def image_server():
    client, runtime = build_client(FakeImageSpec(), max_body_bytes=MAX_BODY_BYTES)
    with client:
        yield client, runtime


@pytest.fixture(scope="module")
def video_server():
    client, runtime = build_client(FakeVideoSpec(), max_body_bytes=MAX_BODY_BYTES)
    with client:
        yield client, runtime


@pytest.mark.parametrize(
    ("case", "method", "path", "kwargs", "status", "param", "code"),
    IMAGE_CASES,
    ids=[c[0] for c in IMAGE_CASES],
)
def test_bad_image_inputs(image_server, case, method, path, kwargs, status, param, code):
    client, runtime = image_server
    num_submitted = len(runtime.submitted)
    _assert_error_shape(client.request(method, path, **kwargs), status, param, code)
    assert len(runtime.submitted) == num_submitted, "a bad request reached the runtime"
    ok = client.post(IMAGES, json=VALID_IMAGE)
    assert ok.status_code == 200 and ok.json()["data"][0]["b64_json"]


@pytest.mark.parametrize(
    ("case", "method", "path", "kwargs", "status", "param", "code"),
    VIDEO_CASES,
    ids=[c[0] for c in VIDEO_CASES],
)
def test_bad_video_inputs(video_server, case, method, path, kwargs, status, param, code):
    client, runtime = video_server
    num_submitted = len(runtime.submitted)
    _assert_error_shape(client.request(method, path, **kwargs), status, param, code)
    assert len(runtime.submitted) == num_submitted, "a bad request reached the runtime"
    ok = client.post("/v1/videos", json=VALID_VIDEO)
    assert ok.status_code == 200 and ok.json()["status"] == "queued"


def test_internal_failure_is_generic_and_server_keeps_serving(image_server):
    client, runtime = image_server
    runtime.fail_kind = "error"
    try:
        response = client.post(IMAGES, json=VALID_IMAGE)
    finally:
        runtime.fail_kind = None
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and "deadbeef" not in response.text
    assert client.post(IMAGES, json=VALID_IMAGE).status_code == 200


@pytest.mark.parametrize(("kind", "status"), [("timeout", 504), ("worker_died", 503)])
def test_runtime_failure_kinds(image_server, kind, status):
    client, runtime = image_server
    runtime.fail_kind = kind
    try:
        response = client.post(IMAGES, json=VALID_IMAGE)
    finally:
        runtime.fail_kind = None
    assert response.status_code == status and "deadbeef" not in response.text


def test_not_ready_is_503_after_validation(image_server):
    client, runtime = image_server
    runtime.ready_flag = False
    try:
        assert client.post(IMAGES, json={**VALID_IMAGE, "n": 0}).status_code == 400
        response = client.post(IMAGES, json=VALID_IMAGE)
        assert response.status_code == 503 and response.json()["error"]["code"] == "not_ready"
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200
    finally:
        runtime.ready_flag = True
    assert client.get("/ready").status_code == 200


def test_chunked_body_over_limit_is_413(image_server):
    client, _ = image_server

    def chunks():
        for _ in range(4):
            yield b" " * (MAX_BODY_BYTES // 2)

    response = client.post(IMAGES, content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert client.post(IMAGES, json=VALID_IMAGE).status_code == 200


def test_reference_image_reaches_runtime_as_uint8(video_server):
    client, runtime = video_server
    response = client.post(
        "/v1/videos",
        data={"prompt": "x", "num_frames": "5", "num_inference_steps": "1", "fps": "8"},
        files={"input_reference": ("ref.png", _png(48, 32), "image/png")},
    )
    assert response.status_code == 200, response.text
    params, inputs = runtime.submitted[-1]
    assert params.has_input_reference is True and params.fps == 8
    reference = inputs["input_reference"]
    assert reference.dtype.name == "uint8" and reference.shape == (32, 48, 3)
    assert tuple(reference[0, 0]) == (200, 10, 10)


def test_openai_style_nested_form_reference(video_server):
    client, runtime = video_server
    data_url = "data:image/png;base64," + base64.b64encode(_png(16, 16)).decode()
    fields = {
        "prompt": "x",
        "num_frames": "5",
        "num_inference_steps": "1",
        "input_reference[image_url]": data_url,
    }
    response = client.post("/v1/videos", data=fields, files={"unused": ("", b"", "text/plain")})
    assert response.status_code == 400 and response.json()["error"]["param"] == "unused"
    response = client.post(
        "/v1/videos", data=fields, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 200, response.text
    assert runtime.submitted[-1][1]["input_reference"].shape == (16, 16, 3)


def test_an_unknown_model_names_the_served_one(image_server):
    client, runtime = image_server
    served = client.get("/v1/models").json()["data"][0]["id"]
    for response in (
        client.post(IMAGES, json={**VALID_IMAGE, "model": "sora-2"}),
        client.get("/v1/models/nope"),
    ):
        assert response.status_code == 404
        assert f"served: {served}" in response.json()["error"]["message"]
