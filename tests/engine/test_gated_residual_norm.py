"""mstar::gated_residual_rms_norm: its PyTorch definition is a Z-Image block's own residual update
and next norm, it checks its inputs, and the Triton kernel computes the definition (under Triton's
CPU interpreter here when Triton is installed; on CUDA in the gpu tier)."""

import pytest
import torch

from mstar.engine.kernels.gated_residual_norm import (
    gated_residual_rms_norm,
    gated_residual_rms_norm_reference,
)
from mstar.models.zimage.dit_layers import RMSNorm, per_token
from tests.engine.kernel_checks import (
    assert_inductor_launches,
    assert_op_names_its_kernel,
    needs_triton,
    run_under_interpreter,
)


def _inputs(num_tokens, dim, num_items, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape, offset=0.0):
        return (offset + torch.randn(*shape, generator=generator)).to(dtype)

    token_item = torch.randint(0, num_items, (num_tokens,), generator=generator)
    return {
        "x": rand(num_tokens, dim),
        "y": rand(num_tokens, dim),
        "gate_rows": rand(num_items, dim).tanh(),
        "y_weight": rand(dim, offset=1.0),
        "x_weight": rand(dim, offset=1.0),
        "scale_rows": rand(num_items, dim, offset=1.0),
        "token_item": token_item,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_items", [1, 3])
def test_definition_is_the_zimage_block_update_then_next_norm(dtype, num_items):
    args = _inputs(11, 24, num_items, dtype)
    y_norm, x_norm = RMSNorm(24, eps=1e-5).to(dtype), RMSNorm(24, eps=1e-5).to(dtype)
    with torch.no_grad():
        y_norm.weight.copy_(args["y_weight"])
        x_norm.weight.copy_(args["x_weight"])
    token_item = args["token_item"]
    want_x = args["x"] + per_token(args["gate_rows"], token_item) * y_norm(args["y"])
    want_h = x_norm(want_x) * per_token(args["scale_rows"], token_item)
    x_new, h = gated_residual_rms_norm(**args, eps=1e-5)
    assert torch.equal(x_new, want_x) and torch.equal(h, want_h)
    last_x, no_h = gated_residual_rms_norm(**{**args, "x_weight": None, "scale_rows": None}, eps=1e-5)
    assert torch.equal(last_x, want_x) and no_h.shape == (0, 24)


def test_bad_inputs_are_named():
    args = _inputs(4, 8, 2, torch.float32)
    with pytest.raises(ValueError, match="x and y must both be"):
        gated_residual_rms_norm(**{**args, "y": args["y"][:3]}, eps=1e-5)
    with pytest.raises(ValueError, match="come together"):
        gated_residual_rms_norm(**{**args, "scale_rows": None}, eps=1e-5)
    with pytest.raises(ValueError, match="y_weight must have 8"):
        gated_residual_rms_norm(**{**args, "y_weight": torch.ones(4)}, eps=1e-5)
    with pytest.raises(ValueError, match="token_item must be"):
        gated_residual_rms_norm(**{**args, "token_item": args["token_item"][:2]}, eps=1e-5)


@needs_triton
def test_triton_kernel_computes_the_definition_under_the_interpreter():
    """fp32 in a child process (TRITON_INTERPRET must be set before the kernel is built)."""
    code = """
import torch
from tests.engine.test_gated_residual_norm import _inputs
from mstar.engine.kernels.gated_residual_norm import gated_residual_rms_norm_reference, run_triton
for num_items, last in ((1, False), (3, False), (3, True)):
    args = _inputs(6, 40, num_items, torch.float32, seed=num_items)
    if last:
        args.update(x_weight=None, scale_rows=None)
    want = gated_residual_rms_norm_reference(**args, eps=1e-5)
    got = run_triton(*args.values(), 1e-5)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
print("ok")
"""
    run_under_interpreter(code)


@pytest.mark.gpu
@pytest.mark.parametrize("num_items", [1, 2])
def test_triton_kernel_on_cuda_is_as_accurate_as_the_definition_in_bf16(num_items):
    """Z-Image's width (3840) at 4k tokens, both paths against the definition in float64 from the
    same bf16 inputs. Element by element the two bf16 paths may part by more than a rounding step:
    where x + gate * norm(y) cancels, one step of the product is a large part of the sum, and the
    next norm and scale carry it on. So the test bounds each path's error against the truth."""
    args = {name: value.cuda() for name, value in _inputs(4128, 3840, num_items, torch.bfloat16).items()}
    wide = {name: value.double() if value.is_floating_point() else value for name, value in args.items()}
    truths = gated_residual_rms_norm_reference(**wide, eps=1e-5)
    kernel_outputs = gated_residual_rms_norm(**args, eps=1e-5)
    torch_outputs = gated_residual_rms_norm_reference(**args, eps=1e-5)
    for got, ours, truth in zip(kernel_outputs, torch_outputs, truths, strict=True):
        kernel_error, torch_error = (got.double() - truth).abs(), (ours.double() - truth).abs()
        assert kernel_error.max() <= 1.5 * torch_error.max()
        assert kernel_error.mean() <= 1.05 * torch_error.mean()


@needs_triton
def test_compile_sees_the_kernel_for_its_cache_key():
    from mstar.engine.kernels.gated_residual_norm_triton import gated_residual_rms_norm_kernel

    assert_op_names_its_kernel("mstar::gated_residual_rms_norm", gated_residual_rms_norm_kernel)


@pytest.mark.gpu
def test_inductor_launches_the_kernel_from_the_compiled_graph():
    """Both forms (with the next norm, and the last block's) launched by inductor's code."""

    def both_forms(args):
        x_new, h = torch.ops.mstar.gated_residual_rms_norm(**args, eps=1e-5)
        last, _ = torch.ops.mstar.gated_residual_rms_norm(
            **{**args, "x": x_new, "x_weight": None, "scale_rows": None}, eps=1e-5
        )
        return h, last

    arg_sets = [
        ({k: v.cuda() for k, v in _inputs(num_tokens, 3840, 2, torch.bfloat16, seed=num_tokens).items()},)
        for num_tokens in (300, 517)
    ]
    assert_inductor_launches("gated_residual_rms_norm_kernel", both_forms, arg_sets)
