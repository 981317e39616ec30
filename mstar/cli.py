"""`mstar serve [MODEL]`, `mstar generate MODEL --prompt ... -o out.png|out.mp4`, `mstar bench ...`.

Heavy imports (uvicorn, the runtime, Pillow/PyAV) happen inside the commands so `mstar --help` is instant.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mstar.errors import InvalidParam, UnknownModel

IMAGE_SUFFIXES = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
VIDEO_SUFFIXES = {".mp4"}
API_KEY_ENV = "MSTAR_API_KEY"
MAIN_LOG_HANDLER = "mstar-main"


class ProgressBars:
    """One tqdm bar per label ("load dit", "warmup", "denoise") fed by (label, done, total) callbacks."""

    def __init__(self) -> None:
        self._bars: dict[str, Any] = {}

    def update(self, label: str, done: int, total: int) -> None:
        from tqdm import tqdm

        bar = self._bars.get(label)
        if bar is None:
            bar = self._bars[label] = tqdm(total=total, desc=label, unit="step", leave=True, file=sys.stderr)
        bar.total = total
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()
            del self._bars[label]

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()


def _add_runtime_flags(parser: argparse.ArgumentParser) -> None:
    from mstar.config import ServerConfig
    from mstar.config_flags import add_config_flags

    parser.add_argument("--config", metavar="FILE.yaml", help="server config (flags override its keys)")
    add_config_flags(parser, ServerConfig)


def _model_help() -> str:
    from mstar.models.registry import DEFAULT_MODEL, model_names

    return f"model name, one of {', '.join(model_names())} (default: the config's, else {DEFAULT_MODEL})"


def build_parser() -> argparse.ArgumentParser:
    from mstar import __version__

    parser = argparse.ArgumentParser(prog="mstar", description="Serve composite generative models.")
    parser.add_argument("--version", action="version", version=f"mstar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the HTTP server (Ctrl-C or SIGTERM stops it)")
    serve.add_argument("model_name", nargs="?", metavar="MODEL", help=_model_help())
    _add_runtime_flags(serve)
    serve.set_defaults(handler=serve_command)

    generate = commands.add_parser("generate", help="run one job without an HTTP server")
    generate.add_argument("model_name", metavar="MODEL", help=_model_help())
    generate.add_argument("--prompt", required=True)
    generate.add_argument(
        "-o", "--output", required=True, help="out.png|.jpg|.webp for images, out.mp4 for videos"
    )
    generate.add_argument("--negative-prompt")
    generate.add_argument("--size", help="WIDTHxHEIGHT")
    generate.add_argument("--num-frames", type=int)
    generate.add_argument("--fps", type=int)
    generate.add_argument(
        "--no-audio", dest="audio", action="store_const", const=False, default=None,
        help="a model with a soundtrack: leave it out of the MP4",
    )  # fmt: skip
    generate.add_argument("--seconds", type=float)
    generate.add_argument("--steps", type=int, dest="num_inference_steps")
    generate.add_argument("--guidance-scale", type=float)
    generate.add_argument("--seed", type=int)
    generate.add_argument("--image", help="reference image for image-to-video")
    _add_runtime_flags(generate)
    generate.set_defaults(handler=generate_command)

    commands.add_parser("bench", help="serving benchmarks (see `mstar bench --help`)", add_help=False)
    return parser


def load_server_config(args: argparse.Namespace) -> Any:
    """The YAML (--config), then the config flags given, then the positional model name."""
    from mstar.config import load_config
    from mstar.config_flags import config_overrides

    overrides = config_overrides(args)
    if args.model_name is not None:
        overrides["model"] = args.model_name
    if args.command == "serve":
        if overrides.get("api_key"):
            print(
                f"mstar: warning: --api-key shows in the process list; set {API_KEY_ENV} instead",
                file=sys.stderr,
            )
        else:
            overrides["api_key"] = os.environ.get(API_KEY_ENV)
    return load_config(args.config, **overrides)


def echo_config(config: Any) -> None:
    import yaml

    shown = config.model_dump()
    if shown.get("api_key"):
        shown["api_key"] = "<set>"
    print("mstar config:\n" + yaml.safe_dump(shown, sort_keys=False).rstrip(), flush=True)


def _listening_socket(host: str, port: int) -> socket.socket:
    """Bind before the (slow) boot so a busy port fails at once; port 0 picks a free one.

    Explicitly TCP with TCP_NODELAY: asyncio turns Nagle's algorithm off only on connections whose
    socket names IPPROTO_TCP, and a socket made with the default protocol (0) does not. With Nagle
    on, the body of a response (written after its headers) waited for the client's delayed ACK:
    every request after the first on a keep-alive connection took 40 ms more."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


async def _boot(runtime: Any) -> None:
    bars = ProgressBars()
    try:
        await runtime.start(on_progress=bars.update)
    finally:
        bars.close()


async def _serve(config: Any, spec: Any, sock: socket.socket) -> int:
    from mstar.api.app import create_app
    from mstar.api.metrics import PrometheusMetrics
    from mstar.api.server import StopSignals, serve_until_stopped
    from mstar.runtime.runtime import Runtime

    metrics = PrometheusMetrics(spec.name)
    runtime = Runtime(config, spec, metrics)
    with StopSignals() as signals:  # SIGTERM/SIGINT: a clean stop, exit 0 (mstar/api/server.py)
        try:
            await _boot(runtime)
        except asyncio.CancelledError:
            if not signals.stopped_during_boot:
                raise
            asyncio.current_task().uncancel()
            print("mstar: stopped during boot", file=sys.stderr, flush=True)
            await runtime.shutdown()
            return 0
        except Exception as error:
            print(f"mstar: boot failed: {error}", file=sys.stderr, flush=True)
            await runtime.shutdown()
            return 1
        app = create_app(config, spec, runtime, metrics=metrics)
        host, port = sock.getsockname()[:2]

        def announce() -> None:
            print(f"mstar: serving '{spec.name}' on http://{host}:{port} (OpenAI API under /v1)", flush=True)

        await serve_until_stopped(app, config, runtime, sock, signals, announce)
    return 0


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record, not as it was when the handler was made (an
    in-process `serve` under a test runner would otherwise keep a stream that gets closed)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_main_logging() -> None:
    """Show the runtime's INFO lines (boot timings, warmup progress) on stderr, formatted like the
    workers' lines. Only the "mstar" loggers: the root logger and uvicorn keep their own levels."""
    logger = logging.getLogger("mstar")
    logger.setLevel(os.environ.get("MSTAR_LOG_LEVEL", "INFO"))
    if any(handler.get_name() == MAIN_LOG_HANDLER for handler in logger.handlers):
        return  # a second serve in the same process must not print every line twice
    handler = _CurrentStderrHandler()
    handler.set_name(MAIN_LOG_HANDLER)
    handler.setFormatter(logging.Formatter("%(asctime)s main %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)


def serve_command(args: argparse.Namespace) -> int:
    from mstar.models.registry import get_model_spec

    configure_main_logging()
    config = load_server_config(args)
    echo_config(config)
    spec = get_model_spec(config.model)
    try:
        sock = _listening_socket(config.host, config.port)
    except OSError as error:
        print(f"mstar: cannot listen on {config.host}:{config.port}: {error}", file=sys.stderr)
        return 1
    with sock, asyncio.Runner(loop_factory=server_loop_factory()) as runner:
        return runner.run(_serve(config, spec, sock))


def server_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (as uvicorn picks it), else asyncio's. Its socket
    writes are faster: a 5.3 MB MP4 download took 7.9 ms against 11.5 on a 2-core host."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _generation_params(args: argparse.Namespace) -> Any:
    from mstar.api.schemas import parse_size
    from mstar.graph import GenerationParams

    width, height = parse_size(args.size)
    return GenerationParams(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        width=width,
        height=height,
        num_frames=args.num_frames,
        fps=args.fps,
        seconds=args.seconds,
        num_inference_steps=args.num_inference_steps,
        guidance_scale=args.guidance_scale,
        seed=args.seed,
        has_input_reference=args.image is not None,
        audio=args.audio,
    )


def _check_output_path(path: Path, media_kind: str) -> None:
    suffixes = VIDEO_SUFFIXES if media_kind == "video" else set(IMAGE_SUFFIXES)
    if path.suffix.lower() not in suffixes:
        raise InvalidParam("output", f"this model makes {media_kind}s: use one of {sorted(suffixes)}")


def _encode_output(outputs: dict[str, Any], path: Path, spec: Any, params: Any) -> bytes:
    """The file's bytes: a PNG/JPEG/WebP, or an MP4 (with the model's soundtrack, if it made one)."""
    from mstar.api.media import encode_image, encode_mp4
    from mstar.api.service import route_kind

    frames = outputs[spec.output_tensor]
    if route_kind(spec.output_kind) == "image":
        return encode_image(frames[0], IMAGE_SUFFIXES[path.suffix.lower()])
    audio_sample_rate = spec.audio_sample_rate(params)
    audio = None if audio_sample_rate is None else outputs[spec.audio_tensor]
    return encode_mp4(frames, int(getattr(params, "fps", 0) or 16), audio, audio_sample_rate)


async def _generate(config: Any, spec: Any, params: Any, inputs: dict | None) -> Any:
    from mstar.runtime.events import Done, Failed, Progress
    from mstar.runtime.runtime import Runtime

    runtime = Runtime(config, spec)
    try:
        await _boot(runtime)
        handle = runtime.submit(params, inputs, timeout_s=config.request_timeout_s)
        bars = ProgressBars()
        async for event in handle.events():
            if isinstance(event, Done):
                bars.close()
                return event.outputs
            if isinstance(event, Failed):
                bars.close()
                raise RuntimeError(f"generation failed ({event.kind}): {event.message}")
            if isinstance(event, Progress):
                bars.update("denoise", event.step, event.total)
        raise RuntimeError("generation ended without a result")
    finally:
        await runtime.shutdown()


def generate_command(args: argparse.Namespace) -> int:
    from mstar.models.registry import get_model_spec

    config = load_server_config(args)
    spec = get_model_spec(config.model)
    from mstar.api.service import route_kind

    output = Path(args.output)
    _check_output_path(output, route_kind(spec.output_kind))
    params = spec.validate(_generation_params(args))
    inputs = None
    if args.image is not None:
        from mstar.api.media import decode_image

        inputs = {"input_reference": decode_image(Path(args.image).read_bytes(), "image")}
    try:
        outputs = asyncio.run(_generate(config, spec, params, inputs))
    except RuntimeError as error:
        print(f"mstar: {error}", file=sys.stderr)
        return 1
    output.write_bytes(_encode_output(outputs, output, spec, params))
    print(f"mstar: wrote {output}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "bench":
        from mstar.bench.cli import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (InvalidParam, UnknownModel, ValueError, FileNotFoundError) as error:
        print(f"mstar: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
