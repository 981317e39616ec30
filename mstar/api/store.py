"""In-process stores: video jobs and generated media served by URL, both expiring after config.job_ttl_s.

Expiry is checked lazily on every access (no background timer to forget or leak); finished entries
are also capped in number and bytes (oldest dropped first) so a burst of jobs cannot exhaust memory.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mstar.api.errors import ApiError

MAX_FINISHED_ENTRIES = 1024
MAX_STORED_BYTES = 2 * 1024**3
FINISHED = ("completed", "failed")


@dataclass
class VideoJob:
    id: str
    model: str
    prompt: str
    size: str
    seconds: str
    created_at: float
    request_id: str
    status: str = "queued"  # queued | in_progress | completed | failed
    num_steps_done: int = 0  # denoise steps, from the runtime's progress events
    num_steps: int = 0
    first_step_at: float | None = None  # monotonic times of the first and latest step seen
    last_step_at: float | None = None
    completed_at: float | None = None
    expires_at: float | None = None
    error: dict[str, Any] | None = None
    content: bytes | None = None
    audio: dict[str, Any] | None = None  # the soundtrack: sample_rate, seconds, codec
    task: asyncio.Task | None = field(default=None, repr=False)

    @property
    def progress(self) -> int:
        """0-100 from the denoise steps done; 100 only once completed (decode and mux follow them)."""
        if self.status == "completed":
            return 100
        return min(99, int(100 * self.num_steps_done / max(self.num_steps, 1)))

    def to_json(self) -> dict[str, Any]:
        """The OpenAI `Video` object."""
        return {
            "id": self.id,
            "object": "video",
            "model": self.model,
            "status": self.status,
            "progress": self.progress,
            "created_at": int(self.created_at),
            "completed_at": None if self.completed_at is None else int(self.completed_at),
            "expires_at": None if self.expires_at is None else int(self.expires_at),
            "prompt": self.prompt,
            "seconds": self.seconds,
            "size": self.size,
            "remixed_from_video_id": None,
            "error": self.error,
            **({"audio": self.audio} if self.audio is not None else {}),
        }


class JobStore:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self.clock = clock
        self._jobs: OrderedDict[str, VideoJob] = OrderedDict()

    def new_job(self, **fields: Any) -> VideoJob:
        job = VideoJob(id=f"video_{secrets.token_hex(16)}", created_at=self.clock(), **fields)
        self._jobs[job.id] = job
        return job

    def finish(self, job: VideoJob, status: str) -> None:
        job.status = status
        job.completed_at = self.clock()
        job.expires_at = job.completed_at + self.ttl_s
        self._cap_finished()

    def get(self, job_id: str) -> VideoJob:
        self.purge_expired()
        job = self._jobs.get(job_id)
        if job is None:
            raise ApiError(404, f"video '{job_id}' not found", param="video_id", code="not_found")
        return job

    def remove(self, job_id: str) -> VideoJob:
        job = self.get(job_id)
        del self._jobs[job_id]
        return job

    def list(self, after: str | None, limit: int, order: str) -> tuple[list[VideoJob], bool]:
        """One page, newest first for `desc`; returns (jobs, has_more)."""
        self.purge_expired()
        jobs = list(self._jobs.values())
        if order == "desc":
            jobs.reverse()
        if after is not None:
            ids = [job.id for job in jobs]
            if after not in ids:
                raise ApiError(400, f"after: unknown video id '{after}'", param="after", code="invalid_value")
            jobs = jobs[ids.index(after) + 1 :]
        return jobs[:limit], len(jobs) > limit

    def all(self) -> list[VideoJob]:
        return list(self._jobs.values())

    def purge_expired(self) -> None:
        now = self.clock()
        expired = [
            job_id
            for job_id, job in self._jobs.items()
            if job.expires_at is not None and job.expires_at <= now
        ]
        for job_id in expired:
            del self._jobs[job_id]

    def _cap_finished(self) -> None:
        finished = [job for job in self._jobs.values() if job.status in FINISHED]  # oldest first
        num_finished = len(finished)
        num_bytes = sum(len(job.content or b"") for job in finished)
        for job in finished:
            if num_finished <= MAX_FINISHED_ENTRIES and num_bytes <= MAX_STORED_BYTES:
                break
            del self._jobs[job.id]
            num_finished -= 1
            num_bytes -= len(job.content or b"")


@dataclass
class StoredMedia:
    data: bytes
    media_type: str
    expires_at: float


class MediaStore:
    """Generated images for `response_format=url`: unguessable ids, served without the API key like a
    presigned URL, gone after the TTL."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self.clock = clock
        self._items: OrderedDict[str, StoredMedia] = OrderedDict()

    def put(self, data: bytes, media_type: str) -> str:
        self.purge_expired()
        media_id = secrets.token_urlsafe(24)
        self._items[media_id] = StoredMedia(data, media_type, self.clock() + self.ttl_s)
        num_bytes = sum(len(item.data) for item in self._items.values())
        while len(self._items) > MAX_FINISHED_ENTRIES or num_bytes > MAX_STORED_BYTES:
            _, dropped = self._items.popitem(last=False)
            num_bytes -= len(dropped.data)
        return media_id

    def get(self, media_id: str) -> StoredMedia:
        self.purge_expired()
        item = self._items.get(media_id)
        if item is None:
            raise ApiError(404, "media not found or expired", param="media_id", code="not_found")
        return item

    def purge_expired(self) -> None:
        now = self.clock()
        for media_id in [k for k, item in self._items.items() if item.expires_at <= now]:
            del self._items[media_id]
