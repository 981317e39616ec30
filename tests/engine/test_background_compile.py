"""Shapes compiled off the serving path: a new shape is served eagerly at once, its compile and
check run on the compile thread, the compiled path is swapped in only after a passing check."""

from __future__ import annotations

import threading

import pytest
import torch

from mstar.engine.background_compile import (
    COMPILED,
    EAGER,
    PENDING,
    BackgroundCompiler,
    CheckedCompile,
    off_serving_path,
)
from mstar.engine.compile import CompiledFunction

HANG_GUARD_S = 60.0


def test_a_new_key_is_served_eagerly_while_its_check_is_blocked():
    gate, entered, threads = threading.Event(), threading.Event(), []

    def check(key):
        threads.append((threading.current_thread().name, off_serving_path()))
        entered.set()
        assert gate.wait(HANG_GUARD_S)
        return 50.0

    compiler = BackgroundCompiler()
    checked = CheckedCompile("probe", check, compiler=compiler)
    assert checked.use_compiled((8, 8)) is False  # returned while nothing has compiled yet
    assert entered.wait(HANG_GUARD_S)
    assert checked.state((8, 8)) == PENDING and compiler.busy
    assert checked.use_compiled((8, 8)) is False  # still compiling: eager again, not a second job
    gate.set()
    assert compiler.wait_idle(HANG_GUARD_S)
    assert checked.state((8, 8)) == COMPILED and checked.psnr_db == {(8, 8): 50.0}
    assert checked.use_compiled((8, 8)) is True
    assert threads == [("mstar-compile", True)] and not off_serving_path()


@pytest.mark.parametrize("outcome", [12.0, "raise"])
def test_a_failing_check_keeps_the_key_eager_for_good(outcome, caplog):
    calls = []

    def check(key):
        calls.append(key)
        if outcome == "raise":
            raise RuntimeError("inductor fell over")
        return outcome

    compiler = BackgroundCompiler()
    checked = CheckedCompile("probe", check, compiler=compiler)
    with caplog.at_level("INFO", logger="mstar.engine.background_compile"):
        assert not checked.use_compiled("k")
        assert compiler.wait_idle(HANG_GUARD_S)
        assert not checked.use_compiled("k") and not checked.use_compiled("k")
    assert calls == ["k"] and checked.state("k") == EAGER and checked.keys(EAGER) == {"k"}
    assert ("disagrees with eager" if outcome != "raise" else "compiling k failed") in caplog.text


def test_warm_checks_inline_and_off_compiles_nothing():
    calls = []
    checked = CheckedCompile("probe", lambda key: calls.append(key) or 45.0, compiler=BackgroundCompiler())
    assert checked.warm("a") == 45.0 and checked.state("a") == COMPILED and calls == ["a"]
    assert checked.use_compiled("a")
    assert checked.warm("b", check=lambda key: 3.0) == 3.0 and checked.state("b") == EAGER
    off = CheckedCompile("probe", lambda key: calls.append(key) or 45.0, enabled=False)
    assert not off.use_compiled("c") and off.warm("c") == float("inf") and calls == ["a"]


def test_compiles_on_the_compile_thread_are_not_recompiles(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module

    monkeypatch.setattr(compile_fx_module, "compile_fx", lambda gm, inputs, config_patches=None: gm.forward)
    torch._dynamo.reset()
    compiled = CompiledFunction(lambda x: x * 2 + 1, "default", "probe", dynamic=False)
    compiled(torch.randn(3))
    compiled.finish_warmup()
    compiler = BackgroundCompiler()
    compiler.submit(lambda: compiled(torch.randn(5)))  # a new static shape, off the serving path
    assert compiler.wait_idle(HANG_GUARD_S)
    assert (compiled.num_compiles, compiled.num_background_compiles, compiled.num_recompiles) == (1, 1, 0)
    compiled(torch.randn(5))  # cached: no compile
    compiled(torch.randn(7))  # on the serving thread after warmup: a recompile in traffic
    assert (compiled.num_compiles, compiled.num_recompiles) == (2, 1)
    torch._dynamo.reset()


def test_a_static_shape_function_keeps_more_graphs_than_dynamos_default():
    import torch._dynamo.config as dynamo_config

    limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    torch._dynamo.reset()
    graphs = []
    compiled = CompiledFunction(
        lambda x: x + 1,
        "default",
        "probe",
        dynamic=False,
        backend=lambda gm, inputs: graphs.append(1) or gm.forward,
    )
    with dynamo_config.patch({limit: 2}):
        for size in range(1, 7):
            compiled(torch.randn(size))
    assert len(graphs) == 6  # one per size, past a limit of 2
    torch._dynamo.reset()
