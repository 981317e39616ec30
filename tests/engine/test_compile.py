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


def test_automatic_dynamic_makes_only_the_changing_dimension_dynamic():
    """dynamic=None: the first shapes compile static, a changed size compiles once more (dynamic),
    and an int argument stays a constant; fullgraph makes a graph break an error."""
    torch._dynamo.reset()

    def heads(x, num_heads: int):
        return x.unflatten(-1, (num_heads, -1)).sum(-1)

    compiled = CompiledFunction(heads, "default", "heads", dynamic=None, backend="eager", fullgraph=True)
    for num_tokens in (1, 2, 5, 17):
        assert compiled(torch.ones(num_tokens, 8), 4).shape == (num_tokens, 4)
    assert compiled.num_compiles == 2  # one token, then any other count

    def breaks(x):
        torch._dynamo.graph_break()
        return x + 1

    with pytest.raises(Exception, match="graph_break|Graph break|graph break"):
        CompiledFunction(breaks, "default", "breaks", dynamic=None, backend="eager", fullgraph=True)(
            torch.ones(3)
        )
    torch._dynamo.reset()


class _FakeSizeVars:
    @staticmethod
    def statically_known_leq(left, right) -> bool:
        return int(left) <= int(right)


class _FakeFeatures:
    def __init__(self, reduction_numel: int, hint):
        self.reduction_numel, self.hint = reduction_numel, hint

    def get_reduction_hint(self):
        return self.hint


def test_dit_rows_up_to_4096_are_reduced_in_one_pass_and_others_keep_inductors_rule():
    from torch._inductor.runtime.hints import ReductionHint
    from torch._inductor.virtualized import V

    from mstar.engine.compile import _row_choices
    from mstar.engine.inductor_choices import PersistentRowChoices

    choices = _row_choices()
    assert choices is not None and choices().uuid() == "mstar-persistent-rows-4096"
    # inductor serialises its cache key (which holds the class) by the class's module and name
    assert choices is PersistentRowChoices and "<locals>" not in choices.__qualname__
    graph = type("FakeGraph", (), {"sizevars": _FakeSizeVars()})()
    with V.set_graph_handler(graph):
        decide = choices.should_use_persistent_reduction
        assert decide(_FakeFeatures(3072, ReductionHint.INNER), False)  # Wan rows
        assert decide(_FakeFeatures(3840, ReductionHint.INNER), False)  # Z-Image rows
        assert not decide(_FakeFeatures(8192, ReductionHint.INNER), False)  # inductor's loop (> 1024)
        assert decide(_FakeFeatures(512, ReductionHint.INNER), False)  # inductor's own rule


def test_the_row_rule_is_in_force_while_inductor_compiles(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module
    import torch._inductor.config as inductor_config
    from torch._inductor.virtualized import V

    seen = {}

    def capture(gm, inputs, config_patches=None):
        seen["choices"] = type(V.choices).__name__
        seen["patches"] = dict(config_patches or {})
        return gm.forward

    monkeypatch.setattr(compile_fx_module, "compile_fx", capture)
    torch._dynamo.reset()
    CompiledFunction(lambda x: x.sum(-1), "deterministic", "rows", persistent_rows=True)(torch.ones(2, 8))
    assert seen["choices"] == "PersistentRowChoices"
    if hasattr(inductor_config, "inductor_choices_class"):
        assert seen["patches"]["inductor_choices_class"]().uuid() == "mstar-persistent-rows-4096"
    else:
        assert seen["patches"]["fx_graph_cache"] is False
    monkeypatch.setenv("MSTAR_PERSISTENT_ROWS", "0")
    torch._dynamo.reset()
    CompiledFunction(lambda x: x.sum(-1), "deterministic", "rows", persistent_rows=True)(torch.ones(2, 8))
    assert seen["choices"] != "PersistentRowChoices" and "inductor_choices_class" not in seen["patches"]
