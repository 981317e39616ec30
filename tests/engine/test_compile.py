import pytest
import torch

from mstar.engine.compile import CompiledFunction, effective_mode, inductor_options


def test_cpu_runs_eager_and_unknown_mode_is_rejected():
    assert effective_mode("deterministic", "cpu") == "off"
    assert effective_mode("max-autotune", "cuda:0") == "max-autotune"
    with pytest.raises(ValueError, match="compile_mode"):
        effective_mode("fast", "cuda:0")


def test_deterministic_mode_turns_autotune_off():
    options = inductor_options("deterministic")
    assert options["max_autotune"] is False and options["coordinate_descent_tuning"] is False
    assert inductor_options("max-autotune")["max_autotune"] is True


def test_off_mode_is_the_eager_function():
    def double(x):
        return x * 2

    compiled = CompiledFunction(double, "off", "double")
    assert compiled._compiled is double
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
    assert compiled.num_recompiles == 0


def test_compiles_are_counted_and_recompiles_flagged(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module

    # Keep the test fast: run the captured graph eagerly instead of building C++ kernels.
    monkeypatch.setattr(compile_fx_module, "compile_fx", lambda gm, inputs, config_patches=None: gm.forward)
    torch._dynamo.reset()
    compiled = CompiledFunction(lambda x: torch.relu(x) + 1, "deterministic", "relu", dynamic=True)
    compiled(torch.randn(4, 3))
    compiled(torch.randn(9, 3))  # same graph: the pack length is dynamic
    assert compiled.num_compiles == 1
    compiled.finish_warmup()
    compiled(torch.randn(5, 3, 2))  # a new rank forces a compile after warmup
    assert compiled.num_recompiles == 1
