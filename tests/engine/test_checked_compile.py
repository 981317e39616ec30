"""The one checked-compile wrapper: a new shape is served eagerly at once, its compile and check
run on the compile thread, the compiled path is swapped in only after a passing check (a miscompile
stays eager for good); warmup checks inline. CheckedFunction pairs a compiled function with its eager
reference on it; compile_methods puts a model's compiled stacks in place."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from mstar.engine.checked_compile import (
    COMPILED,
    EAGER,
    PENDING,
    BackgroundCompiler,
    CheckedCompile,
    CheckedFunction,
    off_serving_path,
    snr_db,
    uint8_psnr_db,
)
from mstar.engine.compile import CompiledFunction, compile_methods

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
    with caplog.at_level("INFO", logger="mstar.engine.checked_compile"):
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


def eager(x: torch.Tensor) -> torch.Tensor:
    return (x * 10).clamp(0, 255).to(torch.uint8)


class Counted:
    def __init__(self, fn):
        self.fn, self.num_calls = fn, 0

    def __call__(self, x):
        self.num_calls += 1
        return self.fn(x)


def shape_key(x):
    return tuple(x.shape)


def example(key):
    return (torch.rand(key, generator=torch.Generator().manual_seed(0)) * 20,)


def test_a_miscompiled_shape_is_served_eagerly_and_a_good_one_compiled(caplog):
    broken = Counted(lambda x: 255 - eager(x) if x.shape[0] == 3 else eager(x))
    reference = Counted(eager)
    compiler = BackgroundCompiler()
    checked = CheckedFunction("probe", broken, reference, shape_key, example, compiler=compiler)
    good, bad = torch.rand(2, 4) * 20, torch.rand(3, 4) * 20
    with caplog.at_level(logging.ERROR, logger="mstar.engine.checked_compile"):
        assert torch.equal(checked(bad), eager(bad)) and torch.equal(checked(good), eager(good))
        assert compiler.wait_idle(HANG_GUARD_S)  # both checked off the serving path, on examples
    assert "disagrees with eager" in caplog.text
    assert checked.checked.keys(EAGER) == {(3, 4)} and checked.checked.keys(COMPILED) == {(2, 4)}
    assert checked.checked.psnr_db[(2, 4)] == float("inf")
    calls = broken.num_calls, reference.num_calls
    assert torch.equal(checked(good), eager(good)) and torch.equal(checked(bad), eager(bad))
    assert (broken.num_calls, reference.num_calls) == (calls[0] + 1, calls[1] + 1)  # compiled, eager


def test_warm_checks_the_given_inputs_inline_and_marks_warmup_on_its_parts():
    compiled, reference = Counted(eager), Counted(eager)

    class Part:
        num_recompiles, num_background_compiles, warmed = 2, 1, False

        def finish_warmup(self):
            self.warmed = True

    part = Part()
    never = BackgroundCompiler()
    checked = CheckedFunction("probe", compiled, reference, shape_key, example, parts=[part], compiler=never)
    x = torch.rand(2, 2) * 20
    assert checked.warm(x) == float("inf") and (compiled.num_calls, reference.num_calls) == (1, 1)
    assert checked.checked.state((2, 2)) == COMPILED and not never.busy  # nothing went to the thread
    assert torch.equal(checked(x), eager(x)) and compiled.num_calls == 2
    checked.finish_warmup()
    assert part.warmed and checked.num_recompiles == 2 and checked.num_background_compiles == 1
    assert uint8_psnr_db(eager(x), eager(x)) == float("inf")
    off = CheckedFunction("probe", compiled, reference, shape_key, example, enabled=False)
    assert torch.equal(off(x), eager(x)) and compiled.num_calls == 2  # compile off: eager, no check


def test_float_outputs_are_checked_by_their_snr_against_the_functions_threshold():
    reference = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    assert snr_db(reference.clone(), reference) == float("inf")
    assert snr_db(reference * 1.01, reference) == pytest.approx(40.0, abs=1e-3)  # 1% error: 40 dB
    assert snr_db((reference * 1000) * 1.01, reference * 1000) == pytest.approx(40.0, abs=1e-3)  # scale-free

    def off_by(percent):
        return CheckedFunction(
            "probe", lambda x: x * (1 + percent / 100), lambda x: x, shape_key, example, compare=snr_db,
            compiler=BackgroundCompiler(), min_psnr_db=30.0,
        )  # fmt: skip

    x = torch.randn(8, 8)
    near, far = off_by(2), off_by(5)  # 34 dB and 26 dB
    assert near.warm(x) == pytest.approx(34.0, abs=0.1) and near.checked.state((8, 8)) == COMPILED
    assert far.warm(x) == pytest.approx(26.0, abs=0.1) and far.checked.state((8, 8)) == EAGER


def test_a_background_check_runs_in_inference_mode_as_serving_does():
    modes = []

    def compiled(x):
        modes.append((threading.current_thread().name, torch.is_inference_mode_enabled()))
        return eager(x)

    compiler = BackgroundCompiler()
    checked = CheckedFunction("probe", compiled, eager, shape_key, example, compiler=compiler)
    checked(torch.rand(2, 3))
    assert compiler.wait_idle(HANG_GUARD_S)
    assert modes == [("mstar-compile", True)]


class Stack(torch.nn.Module):
    compiled_methods = ("run_layers",)

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.run_layers(x) + 1

    def run_layers(self, x):
        return self.linear(x).relu()


def test_compile_methods_sets_the_compiled_copy_in_the_methods_place():
    model = Stack()
    x = torch.randn(3, 4)
    expected = model(x)
    assert compile_methods(model, Stack.compiled_methods, "off", "stack").parts == []
    assert "run_layers" not in vars(model)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    parts = compile_methods(model, Stack.compiled_methods, "deterministic", "stack", backend=backend)
    torch._dynamo.reset()
    assert torch.allclose(model(x), expected) and len(graphs) == 1
    parts.finish_warmup()
    model(torch.randn(5, 4))  # a new size: dynamic shapes, no second graph
    assert parts.num_recompiles == 0 and Stack.run_layers is not model.run_layers


def test_modules_called_on_the_serving_side_wait_for_a_background_fx_trace():
    """fx's Tracer.trace patches nn.Module.__call__ for the whole process: a module called on another
    thread meanwhile failed ("module is not installed as a submodule"). Under module_calls() the
    call waits for the trace instead, and both finish right."""
    import threading

    import torch

    from mstar.engine.checked_compile import _guard_fx_tracing, module_calls

    _guard_fx_tracing()
    inside_trace, release_trace = threading.Event(), threading.Event()

    class Traced(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x):
            inside_trace.set()
            release_trace.wait(timeout=30)  # a hang guard, not a timing
            return self.inner(x)

    served = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    results: dict[str, object] = {}

    def trace():
        results["graph"] = torch.fx.symbolic_trace(Traced())

    def serve():
        try:
            with module_calls():
                results["served"] = served(torch.ones(1, 2))
        except Exception as exc:  # what an unguarded call raised
            results["error"] = exc

    tracer = threading.Thread(target=trace)
    tracer.start()
    assert inside_trace.wait(timeout=30)
    server = threading.Thread(target=serve)
    server.start()
    server.join(timeout=0.5)  # blocked on the lock (an unguarded call would have failed by now)
    release_trace.set()
    tracer.join(timeout=30)
    server.join(timeout=30)
    assert "error" not in results, results.get("error")
    assert torch.equal(results["served"], served(torch.ones(1, 2)))
    assert isinstance(results["graph"], torch.fx.GraphModule)


def test_a_background_compile_starts_after_the_forward_that_asked_for_it():
    import threading

    from mstar.engine.checked_compile import BackgroundCompiler, module_calls

    compiler, started = BackgroundCompiler(), threading.Event()
    with module_calls():  # the serving thread's forward, whose eager call submits the compile
        compiler.submit(started.set)
        assert not started.wait(timeout=0.3)  # it waits for the forward (a hang guard, not a timing)
    assert compiler.wait_idle(timeout_s=30) and started.is_set()
