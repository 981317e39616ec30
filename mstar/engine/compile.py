"""Compile modes shared by the DiT layer stack and the VAE decode.

- `deterministic` (default): inductor with kernel choices by rule (no timing-based autotune,
  `inductor.config.deterministic` where this torch has it), so every server process runs the same
  kernels and one seed gives one output.
- `default`: plain torch.compile.
- `max-autotune`: timing-based kernel selection (no CUDA graphs: pack lengths are dynamic).
- `off`: the eager path, the readable reference.

Compiles are counted through our own dynamo backend, so a compile after warmup (a recompile in
traffic) is logged as a warning and reported to /metrics by the worker. Compiles that run off the
serving path (mstar.engine.checked_compile) are counted apart: no request waited for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

COMPILE_MODES = ("deterministic", "default", "max-autotune", "off")
# Graphs a static-shape function may hold (dynamo's default is 8): a VAE decode keeps one or two
# per size users send, and past the limit dynamo would run every new size eagerly.
MAX_STATIC_GRAPHS = 64
# MSTAR_PERSISTENT_ROWS=0 turns off the DiT stacks' persistent-row rule (mstar.engine.inductor_choices).
PERSISTENT_ROWS_ENV = "MSTAR_PERSISTENT_ROWS"
_warned_no_deterministic = False


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_CACHE_ENV = "TRITON_CACHE_DIR"


def use_compile_cache(directory: str | None) -> None:
    """Keep this process's compiled kernels under `directory` (inductor/ and triton/), so a
    restarted server (or worker) reuses them instead of compiling again. Call before the first
    compile; a cache location already set in the environment wins."""
    if not directory:
        return
    root = os.path.abspath(os.path.expanduser(directory))
    os.environ.setdefault(INDUCTOR_CACHE_ENV, os.path.join(root, "inductor"))
    os.environ.setdefault(TRITON_CACHE_ENV, os.path.join(root, "triton"))


def inductor_options(mode: str) -> dict[str, Any]:
    """Inductor config patches for a compile mode."""
    import torch._inductor.config as inductor_config

    if mode == "max-autotune":
        return {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": False}
    if mode == "default":
        return {"triton.cudagraphs": False}
    options = {
        "max_autotune": False,
        "coordinate_descent_tuning": False,
        "triton.cudagraphs": False,
        "search_autotune_cache": False,
    }
    if hasattr(inductor_config, "deterministic"):
        options["deterministic"] = True
    else:
        _warn_no_deterministic()
    return options


def _warn_no_deterministic() -> None:
    global _warned_no_deterministic
    if not _warned_no_deterministic:
        import torch

        logger.warning(
            "compile_mode=deterministic: torch %s has no inductor 'deterministic' switch; "
            "autotuning is off but kernel choice may still vary between processes",
            torch.__version__,
        )
        _warned_no_deterministic = True


def _row_choices():
    """The persistent-row heuristics class, or None when this torch lacks inductor's hook."""
    try:
        from mstar.engine.inductor_choices import PersistentRowChoices
    except ImportError:
        return None
    return PersistentRowChoices


def effective_mode(mode: str, device: str) -> str:
    """Compile only where it pays: on CPU the eager path runs (inductor's C++ build is slow)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got '{mode}'")
    return "off" if not device.startswith("cuda") else mode


class CompiledFunction:
    """A function compiled once with dynamic shapes; counts compiles and flags recompiles.

    Call `finish_warmup()` after the warmup sizes ran: any compile after that is a recompile.

    `dynamic=None` is dynamo's automatic dynamic: the first call's shapes compile static, and a
    dimension that later changes is made dynamic (a model whose only varying dimension is its token
    count: every other size, and int arguments such as head counts, stay constants). `fullgraph`
    makes a graph break an error instead of a split.

    `duck_shapes=False` gives every dynamic dimension its own symbol. With torch's duck shapes,
    dimensions of equal size at the first compile share one, so a dynamic dimension that happens to
    equal one the graph specialises (the 2 of stacked keys/values) is specialised with it, and a
    later size compiles again. `backend` replaces inductor (tests count compiles with it).

    Python floats seen while tracing (a norm's eps) are constants: traced as symbols, one that a
    kernel needs as a plain float (layer_norm's eps) makes dynamo throw away its first compile and
    trace again (Z-Image's final layer: every boot paid that compile twice, counted as two).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        mode: str,
        name: str,
        dynamic: bool | None = True,
        extra_options: dict[str, Any] | None = None,
        persistent_rows: bool = False,
        duck_shapes: bool = True,
        backend: Callable[..., Any] | str | None = None,
        fullgraph: bool = False,
    ):
        self.name = name
        self.mode = mode
        self.extra_options = dict(extra_options or {})  # inductor config patches on top of the mode's
        # the DiT stacks' reduction rule (mstar.engine.inductor_choices); the env switch turns it off
        self.persistent_rows = persistent_rows and os.environ.get(PERSISTENT_ROWS_ENV, "1") != "0"
        self.num_compiles = 0  # on the calling (serving) thread
        self.num_background_compiles = 0  # off the serving path: nobody waited
        self._num_compiles_at_warmup: int | None = None
        self._eager = fn
        self._backend = backend
        self._duck_shapes = duck_shapes or mode == "off"
        self._fullgraph = fullgraph
        self._compiled = fn if mode == "off" else self._compile(fn, dynamic)
        self._trace_config = None if mode == "off" else self._trace_config_patch(dynamic)

    @property
    def eager(self) -> Callable[..., Any]:
        return self._eager

    def _trace_config_patch(self, dynamic: bool | None) -> Callable[[], Any] | None:
        """What dynamo reads when it traces (inside a call); a compiled graph's guards do not
        depend on it. Built once here, not on every step's call; None when nothing needs patching
        (entering a patch costs tens of microseconds a call)."""
        import torch._dynamo.config as dynamo_config
        import torch.fx.experimental._config as shape_config

        dynamo_options = {}
        if dynamic is not None and hasattr(dynamo_config, "specialize_float"):
            dynamo_options["specialize_float"] = True  # automatic dynamic traces floats as constants
        if dynamic is False:
            limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
            dynamo_options[limit] = MAX_STATIC_GRAPHS
        shape_options = {} if self._duck_shapes else {"use_duck_shape": False}
        if not dynamo_options and not shape_options:
            return None

        @contextlib.contextmanager
        def patch():
            with dynamo_config.patch(dynamo_options), shape_config.patch(shape_options):
                yield

        return patch

    def _compile(self, fn: Callable[..., Any], dynamic: bool | None) -> Callable[..., Any]:
        import torch
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx
        from torch._inductor.virtualized import V

        options = inductor_options(self.mode) | self.extra_options
        choices = _row_choices() if self.persistent_rows else None
        if choices is not None:
            if hasattr(inductor_config, "inductor_choices_class"):
                options["inductor_choices_class"] = choices  # its uuid() keys the FX graph cache
            else:
                options["fx_graph_cache"] = False  # this torch cannot key its cache on the heuristic

        from mstar.engine.checked_compile import off_serving_path

        backend = self._backend
        if isinstance(backend, str):
            backend = torch._dynamo.lookup_backend(backend)  # "aot_eager" etc. in tests

        def counting_backend(graph_module, example_inputs):
            if off_serving_path():
                self.num_background_compiles += 1
                logger.info("%s: compiling a new shape off the serving path", self.name)
            else:
                self.num_compiles += 1
                if self._num_compiles_at_warmup is not None:
                    logger.warning("%s: recompiled in traffic (compile #%d)", self.name, self.num_compiles)
            if backend is not None:
                return backend(graph_module, example_inputs)
            if choices is None:
                return compile_fx(graph_module, example_inputs, config_patches=options)
            with V.set_choices_handler(choices()):
                return compile_fx(graph_module, example_inputs, config_patches=options)

        return torch.compile(fn, backend=counting_backend, dynamic=dynamic, fullgraph=self._fullgraph)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._trace_config is None:
            return self._compiled(*args, **kwargs)
        with self._trace_config():
            return self._compiled(*args, **kwargs)

    def finish_warmup(self) -> None:
        self._num_compiles_at_warmup = self.num_compiles

    @property
    def num_recompiles(self) -> int:
        if self._num_compiles_at_warmup is None:
            return 0
        return self.num_compiles - self._num_compiles_at_warmup


class CompiledParts:
    """The compiled functions of one node (a DiT's layer stacks): warmup ends for all of them at
    once, and their recompiles are counted together."""

    def __init__(self, parts: list[CompiledFunction] | tuple[CompiledFunction, ...] = ()):
        self.parts = list(parts)

    def finish_warmup(self) -> None:
        for part in self.parts:
            part.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return sum(part.num_recompiles for part in self.parts)


def compile_methods(
    model: Any, names: tuple[str, ...], mode: str, label: str, **options: Any
) -> CompiledParts:
    """Each named method of `model` (a DiT's `compiled_methods`) compiled once and set on the
    instance in the method's place, so the model's own forward calls the compiled copy; the class
    keeps the eager method. `options` go to CompiledFunction. Mode "off" leaves the model eager."""
    if mode == "off":
        return CompiledParts()
    parts = []
    for name in names:
        part = CompiledFunction(getattr(model, name), mode, f"{label}.{name}", **options)
        setattr(model, name, part)  # an instance attribute: torch.nn.Module keeps plain callables as such
        parts.append(part)
    return CompiledParts(parts)
