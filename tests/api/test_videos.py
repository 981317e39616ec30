"""Video jobs: lifecycle, progress, download, paging, cancel, 429 on a full queue, expiry."""

from __future__ import annotations

import time

import pytest

from mstar.api.media import Mp4Writer, decode_mp4, encode_mp4
from mstar.api.routes_videos import MAX_POLL_AFTER_MS, MIN_POLL_AFTER_MS, poll_after_ms
from mstar.api.store import JobStore, VideoJob
from tests.api.conftest import build_client, wait_for
from tests.api.fakes import FakeVideoSpec, seeded_frames

VIDEO = {"prompt": "a cat", "num_frames": 5, "num_inference_steps": 3, "size": "32x48", "seed": 7}


def test_video_job_lifecycle(video_client):
    client, runtime = video_client
    created = client.post("/v1/videos", json=VIDEO)
    assert created.status_code == 200
    job = created.json()
    assert job["status"] == "queued" and job["progress"] == 0 and job["object"] == "video"
    assert job["size"] == "32x48" and job["seconds"] == "0.625"  # 5 frames at the default 8 fps
    done = wait_for(client, job["id"])
    assert done["status"] == "completed" and done["progress"] == 100
    assert done["expires_at"] == done["completed_at"] + 3600
    response = client.get(f"/v1/videos/{job['id']}/content")
    assert response.status_code == 200 and response.headers["content-type"] == "video/mp4"
    frames = decode_mp4(response.content)
    expected = seeded_frames(runtime.submitted[-1][0])
    assert frames.shape == expected.shape == (5, 48, 32, 3)
    # H.264 is lossy: close, not exact.
    assert abs(frames.astype(int) - expected.astype(int)).mean() < 4


def test_progress_moves_and_poll_header(video_client):
    client, runtime = video_client
    runtime.step_delay_s = 0.02
    job = client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 20}).json()
    running = wait_for(client, job["id"], statuses=("in_progress",))
    response = client.get(f"/v1/videos/{job['id']}")
    assert MIN_POLL_AFTER_MS <= int(response.headers["openai-poll-after-ms"]) <= MAX_POLL_AFTER_MS
    assert 0 < running["progress"] < 100
    assert client.get(f"/v1/videos/{job['id']}/content").json()["error"]["code"] == "video_not_ready"
    assert wait_for(client, job["id"])["status"] == "completed"
    assert "openai-poll-after-ms" not in client.get(f"/v1/videos/{job['id']}").headers


def bare_job() -> VideoJob:
    """A job outside any store, for the poll hint rule."""
    return VideoJob(id="v", model="m", prompt="p", size="", seconds="", created_at=0.0, request_id="r")


def test_poll_hint_follows_the_jobs_own_pace():
    """Half the job's estimated time to its last step, in [100, 500] ms; the floor while no pace is
    known yet and once the steps are done (decode and mux report no progress)."""
    job = bare_job()
    assert poll_after_ms(job) == MIN_POLL_AFTER_MS  # queued: no pace yet
    job.num_steps, job.num_steps_done, job.first_step_at, job.last_step_at = 50, 1, 10.0, 10.0
    assert poll_after_ms(job) == MIN_POLL_AFTER_MS  # one step: still no pace
    job.num_steps_done, job.last_step_at = 11, 11.2  # 0.12 s a step, 39 left: 4.7 s
    assert poll_after_ms(job) == MAX_POLL_AFTER_MS
    job.num_steps_done, job.last_step_at = 46, 15.4  # 4 steps left: 0.48 s
    assert poll_after_ms(job) == 240
    job.num_steps_done, job.last_step_at = 49, 15.76  # 1 step left: 0.12 s
    assert poll_after_ms(job) == MIN_POLL_AFTER_MS
    job.num_steps_done = 50  # decoding and muxing
    assert poll_after_ms(job) == MIN_POLL_AFTER_MS


def test_the_poll_hint_never_depends_on_the_clients_headers(video_client):
    client, runtime = video_client
    runtime.step_delay_s = 0.02
    job = client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 20}).json()
    sdk_helper = {"x-stainless-poll-helper": "true"}
    hints = set()
    while (response := client.get(f"/v1/videos/{job['id']}", headers=sdk_helper)).json()[
        "status"
    ] != "completed":
        hints.add(int(response.headers["openai-poll-after-ms"]))
        time.sleep(0.01)
    assert len(hints) > 1  # paced by the job's steps, not the floor the header once asked for


def test_cancel_running_job(video_client):
    client, runtime = video_client
    runtime.step_delay_s = 0.05
    job = client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 50}).json()
    wait_for(client, job["id"], statuses=("in_progress",))
    request_id = next(iter(runtime.active))
    deleted = client.delete(f"/v1/videos/{job['id']}")
    assert deleted.json() == {"id": job["id"], "object": "video.deleted", "deleted": True}
    assert runtime.aborted == [request_id]
    assert client.get(f"/v1/videos/{job['id']}").status_code == 404
    deadline = time.monotonic() + 5
    while runtime.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not runtime.active, "the aborted request still runs"
    assert client.post("/v1/videos", json=VIDEO).status_code == 200


def test_failed_job_reports_generic_error(video_client):
    client, runtime = video_client
    runtime.fail_kind = "error"
    job = client.post("/v1/videos", json=VIDEO).json()
    failed = wait_for(client, job["id"])
    runtime.fail_kind = None
    assert failed["status"] == "failed" and failed["error"]["code"] == "internal_error"
    assert "deadbeef" not in str(failed)


def test_frames_muxed_as_they_come_give_the_same_file_as_whole(video_client):
    client, runtime = video_client
    contents = []
    for piece_frames in (0, 2):  # whole at the end, then in pieces of 2 frames as a VAE sends them
        runtime.piece_frames = piece_frames
        job = client.post("/v1/videos", json={**VIDEO, "num_frames": 9}).json()
        assert wait_for(client, job["id"])["status"] == "completed"
        contents.append(client.get(f"/v1/videos/{job['id']}/content").content)
    runtime.piece_frames = 0
    assert contents[0] == contents[1] == encode_mp4(seeded_frames(runtime.submitted[-1][0]), fps=8)


def test_a_finished_job_logs_where_its_time_went(video_client, caplog):
    client, runtime = video_client
    runtime.piece_frames = 2
    with caplog.at_level("INFO", logger="mstar.api"):
        job = client.post("/v1/videos", json={**VIDEO, "num_frames": 9}).json()
        assert wait_for(client, job["id"])["status"] == "completed"
    runtime.piece_frames = 0
    line = next(record.getMessage() for record in caplog.records if job["id"] in record.getMessage())
    marks = dict(part.rsplit(" ", 1) for part in line.split(": ms after arrival: ")[1].split(", "))
    assert list(marks) == ["steps done", "last frames in", "written", "outputs", "mp4"]
    times_ms = [float(value) for value in marks.values()]
    assert times_ms == sorted(times_ms) and "9 frames" in line


def test_a_muxer_failure_fails_the_job_and_stops_its_request(video_client, monkeypatch):
    client, runtime = video_client
    runtime.piece_frames, runtime.step_delay_s = 1, 0.02

    def broken_write(self, frames):
        raise RuntimeError("muxer broke")

    monkeypatch.setattr(Mp4Writer, "write", broken_write)
    job = client.post("/v1/videos", json={**VIDEO, "num_frames": 9}).json()
    failed = wait_for(client, job["id"])
    runtime.piece_frames = 0
    assert failed["status"] == "failed" and failed["error"]["code"] == "internal_error"
    assert len(runtime.aborted) == 1  # the route stopped the request whose clip it could not mux


def test_list_pages(video_client):
    client, _ = video_client
    ids = [client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 1}).json()["id"] for _ in range(5)]
    first = client.get("/v1/videos?limit=2&order=asc").json()
    assert [job["id"] for job in first["data"]] == ids[:2] and first["has_more"] is True
    second = client.get(f"/v1/videos?limit=2&order=asc&after={first['last_id']}").json()
    assert [job["id"] for job in second["data"]] == ids[2:4]
    newest = client.get("/v1/videos?limit=1").json()
    assert newest["data"][0]["id"] == ids[-1]
    for video_id in ids:
        wait_for(client, video_id)


def test_full_queue_is_429_with_retry_after():
    client, runtime = build_client(FakeVideoSpec(), step_delay_s=0.05, max_active=2)
    with client:
        jobs = [client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 50}).json() for _ in range(2)]
        refused = client.post("/v1/videos", json=VIDEO)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert len(client.get("/v1/videos").json()["data"]) == 2, "a refused job must not be listed"
        for job in jobs:
            client.delete(f"/v1/videos/{job['id']}")
        metrics = client.get("/metrics").text
        assert 'mstar:requests_total{model_name="fake-video",outcome="rejected"} 1.0' in metrics


def test_images_n_is_all_or_nothing_under_load():
    client, runtime = build_client(max_active=2)
    with client:
        refused = client.post("/v1/images/generations", json={"prompt": "x", "n": 3})
        assert refused.status_code == 429 and "retry-after" in refused.headers
        assert len(runtime.aborted) == 2, "the admitted part of n must be aborted"
        ok = client.post("/v1/images/generations", json={"prompt": "x", "n": 2, "seed": 11})
        assert ok.status_code == 200
        assert [params.seed for params, _ in runtime.submitted[-2:]] == [11, 12]


def test_job_store_expires_finished_jobs():
    now = [1000.0]
    store = JobStore(ttl_s=60, clock=lambda: now[0])
    running = store.new_job(model="m", prompt="p", size="", seconds="", request_id="r1")
    done = store.new_job(model="m", prompt="p", size="", seconds="", request_id="r2")
    store.finish(done, "completed")
    now[0] += 61
    assert store.get(running.id) is running, "running jobs never expire"
    try:
        store.get(done.id)
        raise AssertionError("expired job still served")
    except Exception as error:  # ApiError 404
        assert getattr(error, "status_code", None) == 404


def test_job_expires_through_the_api():
    client, _ = build_client(FakeVideoSpec(), job_ttl_s=0.3)
    with client:
        job = client.post("/v1/videos", json={**VIDEO, "num_inference_steps": 1}).json()
        wait_for(client, job["id"])
        time.sleep(0.4)
        assert client.get(f"/v1/videos/{job['id']}").status_code == 404


def test_stores_drop_oldest_finished_beyond_their_caps(monkeypatch):
    from mstar.api import store as store_module
    from mstar.api.store import MediaStore

    monkeypatch.setattr(store_module, "MAX_STORED_BYTES", 25)
    jobs = JobStore(ttl_s=60)
    running = jobs.new_job(model="m", prompt="p", size="", seconds="", request_id="r0")
    finished = []
    for index in range(3):
        job = jobs.new_job(model="m", prompt="p", size="", seconds="", request_id=f"r{index + 1}")
        job.content = b"x" * 10
        jobs.finish(job, "completed")
        finished.append(job)
    assert [job.id for job in jobs.all()] == [running.id, finished[1].id, finished[2].id]
    media = MediaStore(ttl_s=60)
    ids = [media.put(b"y" * 10, "image/png") for _ in range(3)]
    assert media.get(ids[2]).data == b"y" * 10
    with pytest.raises(Exception) as error:
        media.get(ids[0])
    assert getattr(error.value, "status_code", None) == 404
