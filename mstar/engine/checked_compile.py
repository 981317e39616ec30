"""The one checked-compile wrapper: no request waits for a compile, and no miscompile serves.

A function compiled with static shapes (the VAE decodes: one graph per latent size) compiles on the
first call of each new shape, and the request making that call would wait for it (16 s for a
Z-Image decode at a size the config did not list, 35 s for a Wan clip). `CheckedCompile` keeps the
serving path off that: a shape it has not compiled is served on the eager function at once, and
its compile runs in a background thread (`BackgroundCompiler`) on example inputs of that shape,
followed by a check of the compiled output against eager (`uint8_psnr_db` of the frames). The
compiled path is swapped in for that shape only when the check passes (>= MIN_PSNR_DB); below
that, or when the compile fails, the shape stays eager for good. Shapes the config names are
compiled and checked inline at warmup (`warm`), before the server reports ready.

The background thread compiles one shape at a time and never blocks the caller: a call for a shape
still compiling runs eagerly. Its compiles are counted apart (`CompiledFunction` asks
`off_serving_path()`), so /metrics' recompiles stay what a request waited for. Its device work goes
to the same CUDA device and stream as the serving thread's (one example call and one eager
reference per new shape), so its memory is the caching allocator's shared pool, not a side stream's.

Compiling on a thread of its own needs one guard: torch.fx's `Tracer.trace` (AOTAutograd traces
every new graph with it) patches `torch.nn.Module.__call__` for the whole process while it runs,
so a module called on another thread meanwhile is taken for part of the traced graph and fails
("module is not installed as a submodule": a Wan clip decoded eagerly while its shape compiled).
`module_calls()` is the lock both sides take: the serving thread around each node's forward
(mstar.runtime.step_loop), the compile thread around fx tracing and its eager reference runs. The
trace holds it for a fraction of a compile (inductor's code generation and Triton's kernel builds run
outside it), so a request may wait that long, never for the whole compile.

`CheckedFunction` pairs a compiled function with its eager reference on one CheckedCompile, for a
caller that wants one callable (Z-Image's decode); a caller that picks between compiled and eager
pieces itself (Wan's chunked decode, mstar.diffusion.vae_decode) asks `use_compiled(key)`.
"""

from __future__ import annotations

import functools
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

logger = logging.getLogger(__name__)

MIN_PSNR_DB = 40.0  # compiled vs eager uint8 frames: bf16 kernel differences stay far above this

_thread_state = threading.local()
_module_calls = threading.RLock()


def module_calls() -> threading.RLock:
    """The lock around code that calls nn.Modules while a background compile may trace (above)."""
    return _module_calls


def _guard_fx_tracing() -> None:
    """Make torch.fx's Tracer.trace hold module_calls() (once per process, before the first job)."""
    from torch.fx._symbolic_trace import Tracer

    if getattr(Tracer.trace, "mstar_guarded", False):
        return
    unguarded = Tracer.trace

    @functools.wraps(unguarded)
    def trace(self, *args, **kwargs):
        with _module_calls:
            return unguarded(self, *args, **kwargs)

    trace.mstar_guarded = True  # type: ignore[attr-defined]
    Tracer.trace = trace  # type: ignore[method-assign]


def uint8_psnr_db(frames: Any, reference: Any) -> float:
    """PSNR of uint8 frames against reference frames of the same shape (inf when equal)."""
    mse = (frames.float() - reference.float()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def snr_db(output: Any, reference: Any) -> float:
    """Signal-to-noise ratio (dB) of a float output against its reference of the same shape (inf
    when equal): the check of a compiled function whose output is not uint8 frames (an encoder's
    latents). Scale-free, so one threshold fits any output's range."""
    reference = reference.float()
    noise = (output.float() - reference).pow(2).sum().item()
    signal = reference.pow(2).sum().item()
    return math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-30) / noise)


def off_serving_path() -> bool:
    """True inside a background compile job (its compiles are not recompiles in traffic)."""
    return getattr(_thread_state, "off_serving_path", False)


class BackgroundCompiler:
    """One daemon thread running compile jobs in order; `submit` returns at once."""

    def __init__(self, name: str = "mstar-compile"):
        self.name = name
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._num_unfinished = 0
        self._idle = threading.Condition(self._lock)

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job()` on the compile thread (on this thread's CUDA device, if any)."""
        device = _current_cuda_device()
        with self._lock:
            self._num_unfinished += 1
            if self._thread is None or not self._thread.is_alive():
                _guard_fx_tracing()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        self._jobs.put(lambda: _on_device(device, job))

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until every submitted job has finished (tests, benchmarks); False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._num_unfinished == 0, timeout=timeout_s)

    @property
    def busy(self) -> bool:
        return self._num_unfinished > 0

    def _run(self) -> None:
        _thread_state.off_serving_path = True
        while True:
            job = self._jobs.get()
            try:
                # Start once the serving thread is between forwards: the eager call that asked for
                # this compile is usually still running, and tracing beside it (Python, the GIL)
                # would slow that very request.
                with _module_calls:
                    pass
                job()
            except Exception:  # a job reports its own failures; this keeps the thread alive
                logger.exception("background compile job failed")
            finally:
                with self._idle:
                    self._num_unfinished -= 1
                    self._idle.notify_all()


def _current_cuda_device() -> int | None:
    import sys

    torch = sys.modules.get("torch")  # never initialise CUDA (or import torch) just to ask
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def _on_device(device: int | None, job: Callable[[], None]) -> None:
    """The current CUDA device is per thread: the compile thread takes the submitter's."""
    if device is None:
        job()
        return
    import torch

    with torch.cuda.device(device):
        job()


_shared_compiler: BackgroundCompiler | None = None


def shared_compiler() -> BackgroundCompiler:
    """The process's compile thread: compiles of every node take turns on it."""
    global _shared_compiler
    if _shared_compiler is None:
        _shared_compiler = BackgroundCompiler()
    return _shared_compiler


PENDING, COMPILED, EAGER = "pending", "compiled", "eager"


class CheckedCompile:
    """Which shapes of one compiled function are served compiled.

        checked = CheckedCompile("zimage_vae_decode", check=compile_and_check)
        fn = compiled if checked.use_compiled(key) else eager   # key: the call's shape, hashable

    `check(key)` compiles the shape (calls the compiled function on example inputs of it) and
    returns the PSNR (dB) of the compiled output against eager on those inputs. `use_compiled(key)`
    is False until that ran and passed; the first call for a new key submits it to `compiler`.
    `enabled=False` (compile mode off) serves everything eagerly and compiles nothing.
    """

    def __init__(
        self,
        name: str,
        check: Callable[[Hashable], float],
        enabled: bool = True,
        compiler: BackgroundCompiler | None = None,
        min_psnr_db: float = MIN_PSNR_DB,
    ):
        self.name = name
        self.enabled = enabled
        self.min_psnr_db = min_psnr_db
        self.psnr_db: dict[Hashable, float] = {}  # key -> compiled vs eager at its check
        self._check = check
        self._compiler = compiler
        self._states: dict[Hashable, str] = {}

    @property
    def compiler(self) -> BackgroundCompiler:
        if self._compiler is None:
            self._compiler = shared_compiler()
        return self._compiler

    @compiler.setter
    def compiler(self, compiler: BackgroundCompiler) -> None:
        self._compiler = compiler

    def state(self, key: Hashable) -> str | None:
        return self._states.get(key)

    def keys(self, state: str) -> set[Hashable]:
        """The keys in `state` (PENDING, COMPILED or EAGER)."""
        return {key for key, value in list(self._states.items()) if value == state}

    def use_compiled(self, key: Hashable) -> bool:
        """Serve `key` compiled? A new key is served eagerly now and compiled in the background."""
        if not self.enabled:
            return False
        state = self._states.get(key)
        if state is None:
            self._states[key] = PENDING
            logger.info("%s: %s not compiled yet: served eagerly while it compiles in the background",
                        self.name, key)  # fmt: skip
            self.compiler.submit(lambda: self._compile(key, self._check))
            return False
        return state == COMPILED

    def warm(self, key: Hashable, check: Callable[[Hashable], float] | None = None) -> float:
        """Compile and check `key` now, on this thread (boot warmup); returns the PSNR (dB)."""
        if not self.enabled:
            return float("inf")
        self._states[key] = PENDING
        self._compile(key, check or self._check)
        return self.psnr_db.get(key, float("-inf"))

    def _compile(self, key: Hashable, check: Callable[[Hashable], float]) -> None:
        started = time.monotonic()
        try:
            psnr_db = self.psnr_db[key] = float(check(key))
        except Exception:
            logger.exception("%s: compiling %s failed; it stays eager", self.name, key)
            self._states[key] = EAGER
            return
        seconds = time.monotonic() - started
        if psnr_db >= self.min_psnr_db:
            self._states[key] = COMPILED
            logger.info("%s: %s compiled in %.1f s, %.1f dB against eager: swapped in",
                        self.name, key, seconds, psnr_db)  # fmt: skip
            return
        self._states[key] = EAGER
        logger.error(
            "%s: compiled %s disagrees with eager: PSNR %.1f dB < %.1f dB; it stays eager",
            self.name, key, psnr_db, self.min_psnr_db,
        )  # fmt: skip


class CheckedFunction:
    """A compiled function and its eager reference as one callable, served per key by CheckedCompile.

        decode = CheckedFunction("zimage_vae_decode", compiled, eager, key=lambda z: tuple(z.shape[-2:]),
                                 example=lambda key: (noise_of(key),), parts=[compiled])
        decode.warm(latents)        # boot warmup: compile and check this key now, on this thread
        frames = decode(latents)    # compiled once its key passed; else eager (its check starts)

    `example(key)` builds the arguments a background check runs on. Checks run in inference mode,
    as the serving threads do (the mode is per thread, and a compiled graph guards on it).
    `parts` are the CompiledFunctions behind `compiled` (their warmup end and recompile counts).
    `compare(output, reference)` scores a check in dB against `min_psnr_db` (uint8 frames' PSNR by
    default; `snr_db` for float outputs).
    """

    def __init__(
        self,
        name: str,
        compiled: Callable[..., Any],
        eager: Callable[..., Any],
        key: Callable[..., Hashable],
        example: Callable[[Hashable], tuple],
        parts: list[Any] | tuple[Any, ...] = (),
        compare: Callable[[Any, Any], float] = uint8_psnr_db,
        enabled: bool = True,
        compiler: BackgroundCompiler | None = None,
        min_psnr_db: float = MIN_PSNR_DB,
    ):
        self.compiled, self.eager, self.key = compiled, eager, key
        self.example, self.compare, self.parts = example, compare, list(parts)
        self.checked = CheckedCompile(
            name, self._check_key, enabled=enabled, compiler=compiler, min_psnr_db=min_psnr_db
        )

    def __call__(self, *args: Any) -> Any:
        if self.checked.use_compiled(self.key(*args)):
            return self.compiled(*args)
        return self.eager(*args)

    def warm(self, *args: Any) -> float:
        """Compile and check the key of `args` on `args` now (warmup); the PSNR (dB)."""
        return self.checked.warm(self.key(*args), lambda key: self._score(args))

    def _check_key(self, key: Hashable) -> float:
        return self._score(self.example(key))

    def _score(self, args: tuple) -> float:
        import torch

        with torch.inference_mode():
            output = self.compiled(*args)
            with module_calls():  # eager modules: not while another thread traces
                return float(self.compare(output, self.eager(*args)))

    def finish_warmup(self) -> None:
        """After the warmup keys: a compile from now on on the serving path is a recompile."""
        for part in self.parts:
            part.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return sum(part.num_recompiles for part in self.parts)

    @property
    def num_background_compiles(self) -> int:
        return sum(getattr(part, "num_background_compiles", 0) for part in self.parts)
