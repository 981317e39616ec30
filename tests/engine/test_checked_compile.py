"""The one checked-compile wrapper: each shape's first call checks the compiled path against eager
and serves the winner from then on; compile_methods puts a model's compiled stacks in place."""

import logging

import torch

from mstar.engine.checked_compile import CheckedCompile, uint8_psnr_db
from mstar.engine.compile import compile_methods


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


def test_a_miscompiled_shape_is_served_eagerly_and_a_good_one_compiled(caplog):
    broken = Counted(lambda x: 255 - eager(x) if x.shape[0] == 3 else eager(x))
    reference = Counted(eager)
    checked = CheckedCompile(broken, reference, "probe", key=shape_key)
    good, bad = torch.rand(2, 4) * 20, torch.rand(3, 4) * 20
    with caplog.at_level(logging.WARNING, logger="mstar.engine.checked_compile"):
        assert torch.equal(checked(bad), eager(bad))  # checked: the reference's output served
    assert "disagrees with eager" in caplog.text and checked.eager_keys == {(3, 4)}
    assert torch.equal(checked(good), eager(good)) and checked.scores[(2, 4)] == float("inf")
    calls = broken.num_calls, reference.num_calls
    checked(good)
    checked(bad)
    assert (broken.num_calls, reference.num_calls) == (calls[0] + 1, calls[1] + 1)  # compiled, eager
    assert not checked.serves_compiled(bad) and checked.serves_compiled(good)


def test_unchecked_keys_serve_compiled_until_checked_when_asked():
    compiled = Counted(eager)
    reference = Counted(eager)
    checked = CheckedCompile(compiled, reference, "probe", key=shape_key, check_first_call=False)
    x = torch.rand(2, 2)
    checked(x)
    assert (compiled.num_calls, reference.num_calls) == (1, 0)
    assert checked.check(x) == float("inf") and reference.num_calls == 1
    assert uint8_psnr_db(eager(x), eager(x)) == float("inf")


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
