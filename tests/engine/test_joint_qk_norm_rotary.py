"""mstar::qk_norm_rotary's "head_fp32" scope and mstar::joint_qk_norm_rotary: their PyTorch
definitions are FLUX.2's own q/k norms + rotary (per stream, then the joint order), the joint op
checks its inputs and compiles once for every pack length, and the Triton kernel computes the
definitions (under Triton's CPU interpreter here when Triton is installed; on CUDA in the gpu tier)."""

import pytest
import torch
from torch import nn

from mstar.engine.kernels.qk_norm_rotary import (
    joint_qk_norm_rotary,
    joint_qk_norm_rotary_reference,
    qk_norm_rotary,
    qk_norm_rotary_reference,
)
from mstar.models.flux2_klein.optimize import apply_rotary_halves
from tests.engine.kernel_checks import (
    assert_inductor_launches,
    assert_op_names_its_kernel,
    needs_triton,
    run_under_interpreter,
)


def _stream(num_tokens, num_heads, head_dim, dtype, generator):
    """Queries as a strided view into a fused qkv projection's output, as the model passes them."""
    qkv = torch.randn(num_tokens, 3 * num_heads * head_dim, generator=generator).to(dtype)
    return qkv[:, : num_heads * head_dim].unflatten(-1, (num_heads, head_dim))


def _norm(head_dim, dtype, generator):
    norm = nn.RMSNorm(head_dim, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(head_dim, generator=generator))
    return norm


def _joint_inputs(num_first, num_second, num_heads, head_dim, dtype, seed=0, gather=True):
    generator = torch.Generator().manual_seed(seed)
    first = _stream(num_first, num_heads, head_dim, dtype, generator)
    second = _stream(num_second, num_heads, head_dim, dtype, generator)
    angles = torch.randn(num_first + num_second, head_dim // 2, generator=generator)
    rows = torch.randperm(num_first + num_second, generator=generator) if gather else None
    norms = _norm(head_dim, dtype, generator), _norm(head_dim, dtype, generator)
    return first, second, norms, angles.cos(), angles.sin(), rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_fp32_scope_is_torch_rms_norm_per_head_then_rotary(dtype):
    first, _, (norm, _), cos, sin, _ = _joint_inputs(7, 0, 3, 16, dtype)
    want = apply_rotary_halves(norm(first), cos, sin)
    assert torch.equal(qk_norm_rotary_reference(first, norm.weight, cos, sin, 1e-6, "head_fp32"), want)
    assert torch.equal(qk_norm_rotary(first, norm.weight, cos, sin, 1e-6, "head_fp32"), want)


@pytest.mark.parametrize("gather", [False, True], ids=["one-item", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_joint_definition_is_each_stream_normed_then_the_joint_order(dtype, gather):
    """FLUX.2's double blocks: text and image queries each normed by their own RMSNorm, put in the
    joint order (cat, then the pack's gather), rotated with the joint order's tables."""
    first, second, (first_norm, second_norm), cos, sin, rows = _joint_inputs(
        5, 9, 3, 16, dtype, gather=gather
    )
    joint = torch.cat([first_norm(first), second_norm(second)])
    want = apply_rotary_halves(joint if rows is None else joint[rows], cos, sin)
    args = (first, second, first_norm.weight, second_norm.weight, cos, sin, rows, 1e-6, "head_fp32")
    assert torch.equal(joint_qk_norm_rotary_reference(*args), want)
    got = joint_qk_norm_rotary(*args)
    assert torch.equal(got, want) and got.is_contiguous()


def test_joint_bad_inputs_are_named():
    first, second, (norm, _), cos, sin, rows = _joint_inputs(4, 3, 2, 8, torch.float32)
    weight = norm.weight
    with pytest.raises(ValueError, match="norm_scope"):
        joint_qk_norm_rotary(first, second, weight, weight, cos, sin, rows, 1e-6, "column")
    with pytest.raises(ValueError, match="second's weight must have 8"):
        joint_qk_norm_rotary(first, second, weight, weight[:4], cos, sin, rows, 1e-6, "head_fp32")
    with pytest.raises(ValueError, match=r"share \[H, D\]"):
        joint_qk_norm_rotary(first, second[:, :1], weight, weight, cos, sin, rows, 1e-6, "head_fp32")
    with pytest.raises(ValueError, match=r"cos/sin must be \[T, D/2\] = \(7, 4\)"):
        joint_qk_norm_rotary(first, second, weight, weight, cos[:5], sin[:5], rows, 1e-6, "head_fp32")
    with pytest.raises(ValueError, match=r"joint_rows must be \[Ta \+ Tb\] = \[7\]"):
        joint_qk_norm_rotary(first, second, weight, weight, cos, sin, rows[:3], 1e-6, "head_fp32")


def test_joint_compiles_once_for_every_pack_length():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")

    def norm_rotate(first, second, first_weight, second_weight, cos, sin, rows):
        op = torch.ops.mstar.joint_qk_norm_rotary
        return op(first, second, first_weight, second_weight, cos, sin, rows, 1e-6, "head_fp32") * 2

    compiled = torch.compile(norm_rotate, backend=counter, fullgraph=True, dynamic=True)
    for num_first, num_second in ((3, 6), (4, 11), (6, 30)):
        first, second, norms, cos, sin, rows = _joint_inputs(num_first, num_second, 2, 16, torch.float32)
        args = (first, second, norms[0].weight.detach(), norms[1].weight.detach(), cos, sin, rows)
        assert torch.equal(compiled(*args), norm_rotate(*args))
    assert counter.frame_count == 1


@needs_triton
def test_triton_kernel_computes_the_definitions_under_the_interpreter():
    """In a child process (TRITON_INTERPRET must be set before the kernel is built), fp32 only:
    every scope, one stream and two, with and without the joint gather."""
    code = """
import torch
from mstar.engine.kernels.qk_norm_rotary import (
    joint_qk_norm_rotary_reference, qk_norm_rotary_reference, run_triton, run_triton_joint)
from tests.engine.test_joint_qk_norm_rotary import _joint_inputs
for scope in ("row", "head", "head_fp32"):
    for gather in (False, True):
        first, second, norms, cos, sin, rows = _joint_inputs(5, 7, 3, 16, torch.float32, gather=gather)
        weights = [n.weight.detach() for n in norms]
        if scope == "row":
            weights = [w.repeat(3) * (1 + index) for index, w in enumerate(weights)]
        args = (first, second, *weights, cos, sin, rows, 1e-6, scope)
        torch.testing.assert_close(run_triton_joint(*args), joint_qk_norm_rotary_reference(*args),
                                   rtol=1e-6, atol=1e-6)
    args = (first, weights[0], cos[:5], sin[:5], 1e-6, scope)
    torch.testing.assert_close(run_triton(*args), qk_norm_rotary_reference(*args), rtol=1e-6, atol=1e-6)
print("ok")
"""
    run_under_interpreter(code)


@needs_triton
def test_compile_sees_the_kernel_for_its_cache_key():
    from mstar.engine.kernels.qk_norm_rotary_triton import qk_norm_rotary_kernel

    assert_op_names_its_kernel("mstar::joint_qk_norm_rotary", qk_norm_rotary_kernel)


def _cuda(*tensors):
    return tuple(None if t is None else t.detach().cuda() for t in tensors)


def _assert_bf16_close(got, want):
    """A normed value may round the other way (rsqrt, fused multiply-adds): one bf16 step of the
    normed values (|y| < 8: 2**-5), which the rotation carries whole into outputs near zero."""
    assert got.is_contiguous() and got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-5)
    assert (got != want).float().mean().item() < 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("gather", [False, True], ids=["one-item", "packed"])
def test_joint_triton_kernel_on_cuda_matches_the_definition_in_bf16(gather):
    """FLUX.2 klein 4B at 1024x1024: 512 text and 4096 image tokens, 24 heads of 128."""
    first, second, norms, cos, sin, rows = _joint_inputs(512, 4096, 24, 128, torch.bfloat16, gather=gather)
    args = (*_cuda(first, second, norms[0].weight, norms[1].weight, cos, sin, rows), 1e-6, "head_fp32")
    _assert_bf16_close(joint_qk_norm_rotary(*args), joint_qk_norm_rotary_reference(*args))


@pytest.mark.gpu
def test_head_fp32_triton_kernel_on_cuda_matches_the_definition_in_bf16():
    """A FLUX.2 single block's queries: 4608 joint tokens read in place from the fused projection."""
    first, _, (norm, _), cos, sin, _ = _joint_inputs(4608, 0, 24, 128, torch.bfloat16)
    args = (*_cuda(first, norm.weight, cos, sin), 1e-6, "head_fp32")
    _assert_bf16_close(qk_norm_rotary(*args), qk_norm_rotary_reference(*args))


@pytest.mark.gpu
def test_inductor_launches_the_joint_kernel_from_the_compiled_graph():
    """One graph for every pack length, the kernel launched by inductor's code, same values."""
    weights = [(torch.rand(128) + 0.5).bfloat16().cuda() for _ in range(2)]

    def norm_rotate(first, second, cos, sin, rows):
        op = torch.ops.mstar.joint_qk_norm_rotary
        return op(first, second, *weights, cos, sin, rows, 1e-6, "head_fp32") * 2

    arg_sets = []
    for num_first, num_second in ((64, 300), (128, 517)):
        first, second, _, cos, sin, rows = _joint_inputs(num_first, num_second, 24, 128, torch.bfloat16)
        arg_sets.append(_cuda(first, second, cos, sin, rows))
    assert_inductor_launches("qk_norm_rotary_kernel", norm_rotate, arg_sets)
