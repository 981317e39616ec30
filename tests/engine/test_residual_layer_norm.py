"""mstar::residual_layer_norm: its PyTorch definition is a Wan block's own residual updates and
LayerNorms (the model test in tests/models/wan22 checks a whole DiT with it), it checks its inputs,
and the Triton kernel computes the definition (under Triton's CPU interpreter here when Triton is
installed; on CUDA in the gpu tier)."""

import pytest
import torch
from torch import nn

from mstar.engine.kernels.residual_layer_norm import residual_layer_norm, residual_layer_norm_reference
from mstar.models.wan22.dit_layers import fp32_layer_norm
from tests.engine.kernel_checks import (
    assert_inductor_launches,
    assert_op_names_its_kernel,
    needs_triton,
    run_under_interpreter,
)

FORMS = ("affine", "modulated", "first")  # after self attention, after cross attention / FFN, no residual


def _inputs(num_tokens, dim, num_items, dtype, form, seed=0):
    """The op's arguments for one of the forms a Wan block uses."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, offset=0.0, to=dtype):
        return (offset + torch.randn(*shape, generator=generator)).to(to)

    args = {
        "x": rand(num_tokens, dim),
        "y": rand(num_tokens, dim),
        "gate_rows": rand(num_items, dim, to=torch.float32),
        "weight": rand(dim, offset=1.0, to=torch.float32),
        "bias": rand(dim, to=torch.float32),
        "scale_rows": rand(num_items, dim, offset=1.0, to=torch.float32),
        "shift_rows": rand(num_items, dim, to=torch.float32),
        "token_item": torch.randint(0, num_items, (num_tokens,), generator=generator),
    }
    if form == "affine":
        args.update(scale_rows=None, shift_rows=None)
    else:
        args.update(weight=None, bias=None)
    if form == "first":
        args.update(y=None, gate_rows=None)
    return args


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_definition_is_the_wan_blocks_update_then_norm(dtype):
    args = _inputs(9, 24, 3, dtype, "affine")
    norm = nn.LayerNorm(24, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(args["weight"])
        norm.bias.copy_(args["bias"])
    x, y, rows = args["x"], args["y"], args["gate_rows"][args["token_item"]]
    want_x = (x.float() + y * rows).type_as(x)
    x_new, h = residual_layer_norm(**args, eps=1e-6)
    assert torch.equal(x_new, want_x)
    assert torch.equal(h, fp32_layer_norm(want_x, 1e-6, norm).type_as(x))
    modulated = {**_inputs(9, 24, 3, dtype, "modulated"), "gate_rows": None}
    x_new, h = residual_layer_norm(**modulated, eps=1e-6)
    token_item = modulated["token_item"]
    want_x = modulated["x"] + modulated["y"]
    scale, shift = modulated["scale_rows"][token_item], modulated["shift_rows"][token_item]
    assert torch.equal(x_new, want_x)
    assert torch.equal(h, (fp32_layer_norm(want_x, 1e-6) * scale + shift).type_as(want_x))
    x_new, _ = residual_layer_norm(**_inputs(9, 24, 3, dtype, "first"), eps=1e-6)
    assert x_new.shape == (0, 24)


def test_bad_inputs_are_named():
    args = _inputs(5, 8, 2, torch.float32, "modulated")
    with pytest.raises(ValueError, match="y must be shaped as x"):
        residual_layer_norm(**{**args, "y": args["y"][:3]}, eps=1e-6)
    with pytest.raises(ValueError, match="gate_rows needs y"):
        residual_layer_norm(**{**args, "y": None}, eps=1e-6)
    with pytest.raises(ValueError, match="scale_rows and shift_rows"):
        residual_layer_norm(**{**args, "shift_rows": None}, eps=1e-6)
    with pytest.raises(ValueError, match=r"gate_rows must be \[num_items, 8\]"):
        residual_layer_norm(**{**args, "gate_rows": args["gate_rows"][:, :4]}, eps=1e-6)
    with pytest.raises(ValueError, match=r"token_item must be \[T\]"):
        residual_layer_norm(**{**args, "token_item": args["token_item"][:2]}, eps=1e-6)


@needs_triton
def test_triton_kernel_computes_the_definition_under_the_interpreter():
    """fp32 in a child process (TRITON_INTERPRET must be set before the kernel is built)."""
    code = """
import torch
from tests.engine.test_residual_layer_norm import FORMS, _inputs
from mstar.engine.kernels.residual_layer_norm import residual_layer_norm_reference, run_triton
for form in FORMS:
    for gated in (True, False):
        args = _inputs(6, 40, 3, torch.float32, form, seed=len(form))
        if not gated:
            args["gate_rows"] = None
        want = residual_layer_norm_reference(**args, eps=1e-6)
        got = run_triton(*args.values(), 1e-6)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
print("ok")
"""
    run_under_interpreter(code)


@needs_triton
def test_compile_sees_the_kernel_for_its_cache_key():
    from mstar.engine.kernels.residual_layer_norm_triton import residual_layer_norm_kernel

    assert_op_names_its_kernel("mstar::residual_layer_norm", residual_layer_norm_kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
def test_triton_kernel_on_cuda_is_as_accurate_as_the_definition_in_bf16(form):
    """Wan 5B's width (3072) for a 480p guidance pair (7020 tokens), both paths against the
    definition in float64 from the same bf16 inputs: each path's error against the truth, bounded
    by the PyTorch path's own (where the residual cancels, one rounding step is a large part)."""
    args = {
        name: None if value is None else value.cuda()
        for name, value in _inputs(7020, 3072, 4, torch.bfloat16, form).items()
    }
    wide = {
        name: value.double() if value is not None and value.is_floating_point() else value
        for name, value in args.items()
    }
    truths = residual_layer_norm_reference(**wide, eps=1e-6)
    kernel_outputs = residual_layer_norm(**args, eps=1e-6)
    torch_outputs = residual_layer_norm_reference(**args, eps=1e-6)
    for got, ours, truth in zip(kernel_outputs, torch_outputs, truths, strict=True):
        assert got.shape == truth.shape and got.dtype == torch.bfloat16
        if got.numel() == 0:
            continue
        kernel_error, torch_error = (got.double() - truth).abs(), (ours.double() - truth).abs()
        assert kernel_error.max() <= 1.5 * torch_error.max()
        assert kernel_error.mean() <= 1.05 * torch_error.mean()


@pytest.mark.gpu
def test_inductor_launches_the_kernel_from_the_compiled_graph():
    """The three forms in a row as a Wan block calls them, launched by inductor's code."""
    op = torch.ops.mstar.residual_layer_norm

    def block_norms(args):
        _, h = op(
            args["x"],
            None,
            None,
            None,
            None,
            args["scale_rows"],
            args["shift_rows"],
            args["token_item"],
            1e-6,
        )
        x, h = op(
            args["x"],
            h,
            args["gate_rows"],
            args["weight"],
            args["bias"],
            None,
            None,
            args["token_item"],
            1e-6,
        )
        return op(x, h, None, None, None, args["scale_rows"], args["shift_rows"], args["token_item"], 1e-6)

    arg_sets = []
    for num_tokens in (300, 517):
        args = _inputs(num_tokens, 3072, 2, torch.bfloat16, "affine", seed=num_tokens)
        args.update(scale_rows=args["gate_rows"] + 1, shift_rows=args["gate_rows"] * 0.5)
        arg_sets.append(({name: value.cuda() for name, value in args.items()},))
    assert_inductor_launches("residual_layer_norm_kernel", block_norms, arg_sets)
