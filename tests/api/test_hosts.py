"""Host and Origin checks (DNS rebinding and cross-site requests against a loopback server) and
media URLs that never come from the client's Host header."""

from __future__ import annotations

import pytest

from mstar.api.hosts import HostPolicy, split_host
from tests.api.conftest import build_client
from tests.api.fakes import FakeImageSpec, FakeVideoSpec

IMAGES = "/v1/images/generations"
VALID_IMAGE = {"prompt": "a 7", "num_inference_steps": 1}


def _assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


@pytest.fixture(scope="module")
def loopback():
    client, runtime = build_client(FakeImageSpec())
    with client:
        yield client, runtime


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "10.0.0.5"])
def test_loopback_server_refuses_other_host_names(loopback, host):
    client, runtime = loopback
    num_submitted = len(runtime.submitted)
    _assert_error(client.get("/v1/models", headers={"host": host}), 400, "invalid_host")
    _assert_error(client.get("/ready", headers={"host": host}), 400, "invalid_host")
    _assert_error(client.post(IMAGES, json=VALID_IMAGE, headers={"host": host}), 400, "invalid_host")
    assert len(runtime.submitted) == num_submitted


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8000", "localhost", "LOCALHOST:1", "localhost.", "[::1]:80", "127.9.9.9"]
)
def test_loopback_server_takes_loopback_names(loopback, host):
    client, _ = loopback
    assert client.post(IMAGES, json=VALID_IMAGE, headers={"host": host}).status_code == 200


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "http://127.0.0.1:9999", "http://localhost:8000", "null", "evil"]
)
def test_cross_site_state_changes_are_refused(loopback, origin):
    client, runtime = loopback
    num_submitted = len(runtime.submitted)
    headers = {"host": "127.0.0.1:8000", "origin": origin}
    # The classic CSRF: a form on another site posts to the loopback server (no preflight needed).
    form = client.post(IMAGES, data={"prompt": "x"}, headers=headers)
    _assert_error(form, 403, "cross_origin_request")
    _assert_error(client.post(IMAGES, json=VALID_IMAGE, headers=headers), 403, "cross_origin_request")
    _assert_error(client.delete("/v1/videos/video_x", headers=headers), 403, "cross_origin_request")
    assert len(runtime.submitted) == num_submitted
    assert client.get("/v1/models", headers=headers).status_code == 200  # reads are not state changes


def test_same_origin_and_originless_requests_pass(loopback):
    client, _ = loopback
    for headers in (
        {"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000"},
        {"host": "localhost", "origin": "http://localhost:80"},
        {"host": "127.0.0.1:8000"},  # curl, SDKs: no Origin
    ):
        assert client.post(IMAGES, json=VALID_IMAGE, headers=headers).status_code == 200


def test_allowed_hosts_and_public_url_widen_the_names():
    client, _ = build_client(
        FakeImageSpec(),
        allowed_hosts=["api.internal", "*.example.com"],
        public_url="https://gen.example.org/",
    )
    with client:
        for host in ("api.internal:8000", "a.example.com", "gen.example.org", "localhost"):
            assert client.post(IMAGES, json=VALID_IMAGE, headers={"host": host}).status_code == 200, host
        for host in ("example.com", "evil.example", "api.internal.evil.example"):
            _assert_error(client.get("/v1/models", headers={"host": host}), 400, "invalid_host")
        # A page on a listed host may post (a UI behind the same proxy); other sites may not.
        headers = {"host": "127.0.0.1:8000", "origin": "https://ui.example.com"}
        assert client.post(IMAGES, json=VALID_IMAGE, headers=headers).status_code == 200
        headers["origin"] = "https://evil.example"
        _assert_error(client.post(IMAGES, json=VALID_IMAGE, headers=headers), 403, "cross_origin_request")


def test_non_loopback_bind_takes_any_host_unless_listed():
    assert HostPolicy("0.0.0.0", []).allows_host("gen.example.org")
    assert not HostPolicy("0.0.0.0", ["gen.example.org"]).allows_host("evil.example")
    assert HostPolicy("0.0.0.0", ["gen.example.org"]).allows_host("127.0.0.1")
    assert HostPolicy("10.0.0.5", ["*"]).allows_host("evil.example")
    assert HostPolicy("10.0.0.5", ["api.internal"]).allows_host("10.0.0.5")
    assert not HostPolicy("127.0.0.1", []).allows_host("10.0.0.5")
    assert split_host("[::1]:8000") == ("[::1]", "8000") and split_host("Example.COM.") == ("example.com", "")


def test_media_urls_come_from_the_bound_address_not_the_host_header(loopback):
    client, _ = loopback
    body = {**VALID_IMAGE, "response_format": "url"}
    url = client.post(IMAGES, json=body, headers={"host": "localhost:9999"}).json()["data"][0]["url"]
    assert url.startswith("http://127.0.0.1/media/"), url  # the test client's socket address
    assert client.get(url).status_code == 200


def test_media_urls_come_from_public_url():
    client, _ = build_client(FakeImageSpec(), public_url="https://gen.example.org/base/")
    with client:
        body = {**VALID_IMAGE, "response_format": "url"}
        url = client.post(IMAGES, json=body, headers={"host": "localhost:9999"}).json()["data"][0]["url"]
    assert url.startswith("https://gen.example.org/base/media/"), url


def test_video_routes_are_guarded_too():
    client, runtime = build_client(FakeVideoSpec())
    with client:
        body = {"prompt": "a cat", "num_inference_steps": 1, "num_frames": 5}
        _assert_error(
            client.post("/v1/videos", json=body, headers={"host": "evil.example"}), 400, "invalid_host"
        )
        headers = {"origin": "https://evil.example"}
        _assert_error(client.post("/v1/videos", json=body, headers=headers), 403, "cross_origin_request")
        assert runtime.submitted == []
        assert client.post("/v1/videos", json=body).status_code == 200
