"""The mstar Python SDK: images, video jobs (create, poll, download) and health over HTTP (httpx only).

from mstar.client import Client
with Client("http://127.0.0.1:8000", api_key="...") as client:
    png = client.generate_image("a handwritten 7", seed=1)
    mp4 = client.generate_video("a cat surfing", on_progress=print)
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_POLL_INTERVAL_S = 1.0
FINISHED_STATUSES = ("completed", "failed")


def poll_wait_s(poll_interval_s: float | None, headers: Any) -> float:
    """The wait before a video job's next status poll: `poll_interval_s` when given, else the
    server's `openai-poll-after-ms` hint of this poll (1 s without one, as the OpenAI SDK waits)."""
    if poll_interval_s is not None:
        return poll_interval_s
    hinted_ms = headers.get("openai-poll-after-ms")
    return int(hinted_ms) / 1000 if hinted_ms else DEFAULT_POLL_INTERVAL_S


class MstarError(RuntimeError):
    """An error answered by the server (or a failed video job), with its OpenAI-shaped fields."""

    def __init__(self, status_code: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code


def _drop_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def _raise_for_error(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        raise MstarError(response.status_code, error["message"], error.get("param"), error.get("code"))
    except (ValueError, KeyError, TypeError):
        raise MstarError(response.status_code, response.text or response.reason_phrase) from None


class Client:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        _raise_for_error(response)
        return response

    def health(self) -> bool:
        """True when the server process answers /health."""
        try:
            return self._http.get("/health").is_success
        except httpx.TransportError:
            return False

    def ready(self) -> bool:
        """True when the server can run requests (/ready is 200)."""
        try:
            return self._http.get("/ready").is_success
        except httpx.TransportError:
            return False

    def models(self) -> list[dict[str, Any]]:
        return self._request("GET", "/v1/models").json()["data"]

    def generate_image(
        self,
        prompt: str,
        *,
        model: str | None = None,
        size: str | None = None,
        output_format: str = "png",
        negative_prompt: str | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int | None = None,
    ) -> bytes:
        """One image, encoded as `output_format` (png, jpeg or webp)."""
        body = _drop_none(
            {
                "prompt": prompt,
                "model": model,
                "size": size,
                "n": 1,
                "response_format": "b64_json",
                "output_format": output_format,
                "negative_prompt": negative_prompt,
                "num_inference_steps": num_inference_steps,
                "guidance_scale": guidance_scale,
                "seed": seed,
            }
        )
        data = self._request("POST", "/v1/images/generations", json=body).json()["data"]
        return base64.b64decode(data[0]["b64_json"])

    def create_video(
        self, prompt: str, input_reference: bytes | str | Path | None = None, **fields: Any
    ) -> dict:
        """Start a video job; returns the job object (status `queued`)."""
        body = _drop_none({"prompt": prompt, **fields})
        if input_reference is None:
            return self._request("POST", "/v1/videos", json=body).json()
        image = input_reference if isinstance(input_reference, bytes) else Path(input_reference).read_bytes()
        form = {key: str(value) for key, value in body.items()}
        files = {"input_reference": ("reference.png", image, "application/octet-stream")}
        return self._request("POST", "/v1/videos", data=form, files=files).json()

    def retrieve_video(self, video_id: str) -> dict:
        return self._request("GET", f"/v1/videos/{video_id}").json()

    def delete_video(self, video_id: str) -> dict:
        return self._request("DELETE", f"/v1/videos/{video_id}").json()

    def download_video(self, video_id: str) -> bytes:
        return self._request("GET", f"/v1/videos/{video_id}/content").content

    def wait_for_video(
        self,
        video_id: str,
        on_progress: Callable[[int], None] | None = None,
        poll_interval_s: float | None = None,
    ) -> dict:
        """Poll until the job finishes (the server's `openai-poll-after-ms` sets the pace unless given)."""
        while True:
            response = self._request("GET", f"/v1/videos/{video_id}")
            job = response.json()
            if on_progress is not None:
                on_progress(job["progress"])
            if job["status"] in FINISHED_STATUSES:
                return job
            time.sleep(poll_wait_s(poll_interval_s, response.headers))

    def generate_video(
        self,
        prompt: str,
        *,
        model: str | None = None,
        size: str | None = None,
        seconds: str | None = None,
        fps: int | None = None,
        num_frames: int | None = None,
        negative_prompt: str | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        seed: int | None = None,
        input_reference: bytes | str | Path | None = None,
        on_progress: Callable[[int], None] | None = None,
        poll_interval_s: float | None = None,
    ) -> bytes:
        """Create a video job, poll it to the end and return the MP4 bytes; MstarError if it fails."""
        job = self.create_video(
            prompt,
            input_reference,
            model=model,
            size=size,
            seconds=seconds,
            fps=fps,
            num_frames=num_frames,
            negative_prompt=negative_prompt,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            seed=seed,
        )
        job = self.wait_for_video(job["id"], on_progress, poll_interval_s)
        if job["status"] == "failed":
            error = job.get("error") or {}
            raise MstarError(500, error.get("message", "the video job failed"), code=error.get("code"))
        return self.download_video(job["id"])
