"""`mstar serve`, `mstar generate` and the `mstar bench` dispatch."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from mstar import cli
from mstar.api.media import decode_mp4
from tests.api.fakes import FakeImageParams, seeded_frames

REPO = Path(__file__).resolve().parents[2]
IMAGE_SPEC = "tests.api.live_models:LiveImageSpec"
VIDEO_SPEC = "tests.api.live_models:LiveVideoSpec"


def start_serve(*args: str, env_key: str | None = None, **env_vars: str) -> subprocess.Popen:
    # REPO first, the caller's path kept: on the GPU machine the server's deps come through PYTHONPATH
    python_path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=python_path, **env_vars)
    env.pop("MSTAR_API_KEY", None)
    if env_key:
        env["MSTAR_API_KEY"] = env_key
    return subprocess.Popen(
        [sys.executable, "-m", "mstar.cli", "serve", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def read_until(stream, marker: str, timeout_s: float = 60.0) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    raise AssertionError(f"'{marker}' never printed; got {lines}")


def test_serve_echoes_config_listens_and_guards(tmp_path):
    config_file = tmp_path / "server.yaml"
    config_file.write_text("max_queue_size: 3\nwarmup: false\n")
    process = start_serve(IMAGE_SPEC, "--port", "0", "--config", str(config_file), env_key="env-key")
    try:
        lines = read_until(process.stdout, "mstar: serving")
        echoed = "".join(lines)
        assert "max_queue_size: 3" in echoed and "api_key: <set>" in echoed and "env-key" not in echoed
        base_url = lines[-1].split(" on ")[1].split()[0]
        assert base_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{base_url}/health").status_code == 200
        assert httpx.get(f"{base_url}/v1/models").status_code == 401
        models = httpx.get(f"{base_url}/v1/models", headers={"Authorization": "Bearer env-key"}).json()
        assert models["data"][0]["id"] == "live-image"
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    assert process.returncode == 0


def test_serve_exits_nonzero_with_the_boot_error():
    process = start_serve("tests.api.live_models:BrokenBootImageSpec", "--port", "0")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "boot failed" in stderr and "attention backend 'fa3' cannot run on device 'cpu'" in stderr


def test_serve_logs_where_the_boot_time_goes():
    process = start_serve("tiny-digits", "--port", "0")
    try:
        read_until(process.stdout, "mstar: serving")
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    seconds = r"\d+\.\d s"
    for line in (
        f"worker0 INFO mstar.worker: built node\\(s\\) text_encoder,dit,decoder on cpu in {seconds}",
        f"worker0 INFO mstar.worker: node dit warmed up in {seconds}",
        f"main INFO mstar.runtime: boot: 1 worker\\(s\\) up in {seconds}",
        f"main INFO mstar.runtime: warmup request 1/1 done in {seconds}",
        f"main INFO mstar.runtime: boot: workers up in {seconds}, 1 warmup request\\(s\\) in {seconds}, "
        f"ready after {seconds}",
    ):
        assert re.search(line, stderr), f"no '{line}' in {stderr}"


def test_main_logging_covers_only_mstar_loggers_and_is_added_once(monkeypatch):
    monkeypatch.setenv("MSTAR_LOG_LEVEL", "DEBUG")
    logger, root = logging.getLogger("mstar"), logging.getLogger()
    level, root_level, root_handlers = logger.level, root.level, list(root.handlers)
    try:
        cli.configure_main_logging()
        cli.configure_main_logging()
        ours = [handler for handler in logger.handlers if handler.get_name() == cli.MAIN_LOG_HANDLER]
        assert len(ours) == 1 and logger.level == logging.DEBUG
        assert root.level == root_level and root.handlers == root_handlers
    finally:
        for handler in [h for h in logger.handlers if h.get_name() == cli.MAIN_LOG_HANDLER]:
            logger.removeHandler(handler)
        logger.setLevel(level)


def test_api_key_comes_from_the_environment_and_the_flag_warns(monkeypatch, capsys):
    monkeypatch.setenv(cli.API_KEY_ENV, "from-env")
    config = cli.load_server_config(cli.build_parser().parse_args(["serve", IMAGE_SPEC]))
    assert config.api_key == "from-env" and "warning" not in capsys.readouterr().err
    config = cli.load_server_config(cli.build_parser().parse_args(["serve", IMAGE_SPEC, "--api-key", "k"]))
    assert config.api_key == "k"
    assert f"--api-key shows in the process list; set {cli.API_KEY_ENV}" in capsys.readouterr().err


def test_serve_rejects_a_bad_flag_value(capsys):
    assert cli.main(["serve", IMAGE_SPEC, "--device", "tpu"]) == 2
    assert "device" in capsys.readouterr().err


def test_generate_image(tmp_path):
    output = tmp_path / "digit.png"
    assert cli.main(["generate", IMAGE_SPEC, "--prompt", "a 3", "--steps", "2", "--seed", "4",
                     "--size", "48x32", "-o", str(output)]) == 0  # fmt: skip
    image = np.asarray(Image.open(io.BytesIO(output.read_bytes())))
    params = FakeImageParams(
        prompt="p", seed=4, height=32, width=48, num_inference_steps=1, guidance_scale=1.0
    )
    assert np.array_equal(image, seeded_frames(params)[0])


def test_generate_video(tmp_path):
    output = tmp_path / "clip.mp4"
    assert cli.main(["generate", VIDEO_SPEC, "--prompt", "x", "--steps", "2", "--num-frames", "5",
                     "-o", str(output)]) == 0  # fmt: skip
    assert decode_mp4(output.read_bytes()).shape == (5, 32, 32, 3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", IMAGE_SPEC, "--prompt", "x", "-o", "out.mp4"], "output"),
        (["generate", IMAGE_SPEC, "--prompt", "x", "--steps", "99", "-o", "out.png"], "num_inference_steps"),
        (["generate", "no-such-model", "--prompt", "x", "-o", "out.png"], "no-such-model"),
    ],
)
def test_generate_refuses_bad_input_before_boot(args, message, capsys):
    assert cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_bench_dispatches_lazily(monkeypatch):
    import mstar.bench.cli as bench_cli

    seen = []
    monkeypatch.setattr(bench_cli, "main", lambda argv: seen.append(argv) or 7)
    assert cli.main(["bench", "serve", "--url", "http://x"]) == 7
    assert seen == [["serve", "--url", "http://x"]]


def test_progress_bars_follow_labels(capsys):
    bars = cli.ProgressBars()
    bars.update("load dit", 1, 3)
    bars.update("warmup", 0, 2)
    bars.update("load dit", 3, 3)
    assert list(bars._bars) == ["warmup"], "a finished bar is closed"
    bars.close()
    err = capsys.readouterr().err
    assert "load dit" in err and "3/3" in err and "warmup" in err


def test_main_log_handler_writes_to_the_current_stderr(monkeypatch):
    logger = logging.getLogger("mstar")
    try:
        cli.configure_main_logging()
        later = io.StringIO()
        monkeypatch.setattr(sys, "stderr", later)  # e.g. a test runner's capture replaced it
        logging.getLogger("mstar.runtime").warning("boot: a line")
        assert "main WARNING mstar.runtime: boot: a line" in later.getvalue()
    finally:
        for handler in [h for h in logger.handlers if h.get_name() == cli.MAIN_LOG_HANDLER]:
            logger.removeHandler(handler)


def test_served_connections_send_without_nagle():
    """The listening socket's connections, as asyncio (uvicorn's loop) accepts them, have Nagle's
    algorithm off: with it on, a response's body waited 40 ms for the client's delayed ACK on every
    keep-alive request after the first."""
    import asyncio
    import socket

    sock = cli._listening_socket("127.0.0.1", 0)

    async def accept_one() -> int:
        seen: dict[str, int] = {}

        async def handle(reader, writer) -> None:
            seen["nodelay"] = writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY
            )
            writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return seen["nodelay"]

    assert asyncio.run(accept_one()) != 0


def test_server_runs_on_uvloop_when_installed_and_on_asyncio_without(monkeypatch):
    import uvloop

    from mstar.cli import server_loop_factory

    loop = server_loop_factory()()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails: asyncio's own loop
    assert server_loop_factory() is None
