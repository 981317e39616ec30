"""mstar::qk_norm_rotary: its PyTorch definition is each DiT's own q/k norm + rotary code, the op
checks its inputs and compiles once for every pack length, and the Triton kernel computes the
definition (under Triton's CPU interpreter here when Triton is installed; on CUDA in the gpu tier)."""

import pytest
import torch
from torch import nn

from mstar.engine.kernels.qk_norm_rotary import qk_norm_rotary, qk_norm_rotary_reference
from mstar.models.zimage.dit_layers import RMSNorm
from mstar.models.zimage.optimize import apply_rotary_halves
from tests.engine.kernel_checks import (
    assert_inductor_launches,
    assert_op_names_its_kernel,
    needs_triton,
    run_under_interpreter,
)


def _inputs(num_tokens, num_heads, head_dim, dtype, seed=0):
    """x as a strided view into a wider projection output, like q and k inside the fused qkv GEMM."""
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(num_tokens, 3 * num_heads * head_dim, generator=generator).to(dtype)
    x = qkv[:, num_heads * head_dim : 2 * num_heads * head_dim].unflatten(-1, (num_heads, head_dim))
    angles = torch.randn(num_tokens, head_dim // 2, generator=generator)
    return x, angles.cos(), angles.sin(), generator


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_scope_is_zimage_rms_norm_then_rotary(dtype):
    x, cos, sin, generator = _inputs(7, 3, 16, dtype)
    norm = RMSNorm(16, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(16, generator=generator))
    want = apply_rotary_halves(norm(x), cos, sin)
    assert torch.equal(qk_norm_rotary_reference(x, norm.weight, cos, sin, 1e-5, "head"), want)
    assert torch.equal(qk_norm_rotary(x, norm.weight, cos, sin, 1e-5, "head"), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_scope_is_wan_rms_norm_over_all_heads_then_rotary(dtype):
    from mstar.models.wan22.optimize import apply_rotary_halves as wan_rotary

    x, cos, sin, generator = _inputs(7, 3, 16, dtype)
    norm = nn.RMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(48, generator=generator))
    want = wan_rotary(norm(x.flatten(1)).unflatten(-1, (3, 16)), cos[:, None], sin[:, None])
    got = qk_norm_rotary(x, norm.weight, cos, sin, 1e-6, "row")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_head_tables_are_ltx2_row_norm_then_split_rotary(dtype):
    """cos/sin [T, H, D/2] (LTX-2's split layout: each head its own frequencies): the op is LTX-2's
    RMS norm over the row, then its split rotary, with the same roundings."""
    from mstar.models.ltx2.rope import apply_rotary

    x, _, _, generator = _inputs(7, 3, 16, dtype)
    angles = torch.randn(7, 3, 8, generator=generator)
    norm = nn.RMSNorm(48, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(48, generator=generator))
    want = apply_rotary(norm(x.flatten(1)), (angles.cos(), angles.sin())).unflatten(-1, (3, 16))
    got = qk_norm_rotary(x, norm.weight, angles.cos(), angles.sin(), 1e-6, "row")
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bad_inputs_are_named():
    x, cos, sin, _ = _inputs(4, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="norm_scope"):
        qk_norm_rotary(x, torch.ones(8), cos, sin, 1e-6, "column")
    with pytest.raises(ValueError, match="weight must have 16"):
        qk_norm_rotary(x, torch.ones(8), cos, sin, 1e-6, "row")
    with pytest.raises(ValueError, match=r"cos/sin must be \[T, D/2\] = \(4, 4\) or \[T, H, D/2\]"):
        qk_norm_rotary(x, torch.ones(8), cos[:, :2], sin[:, :2], 1e-6, "head")


def test_compiles_once_for_every_pack_length():
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("aot_eager")
    weight = torch.rand(16) + 0.5

    def norm_rotate(x, cos, sin):
        return torch.ops.mstar.qk_norm_rotary(x, weight, cos, sin, 1e-5, "head") * 2

    compiled = torch.compile(norm_rotate, backend=counter, fullgraph=True, dynamic=True)
    for num_tokens in (5, 9, 33):
        x, cos, sin, _ = _inputs(num_tokens, 2, 16, torch.float32, seed=num_tokens)
        assert torch.equal(compiled(x, cos, sin), norm_rotate(x, cos, sin))
    assert counter.frame_count == 1


@needs_triton
def test_triton_kernel_computes_the_definition_under_the_interpreter():
    """In a child process: TRITON_INTERPRET must be set before the kernel is built. fp32 only (the
    interpreter's bf16 casts do not round as the GPU's do; the gpu tier checks bf16)."""
    code = """
import torch
from mstar.engine.kernels.qk_norm_rotary import qk_norm_rotary_reference, run_triton
generator = torch.Generator().manual_seed(0)
for scope, num_heads in (("row", 3), ("head", 3), ("head", 1)):
    qkv = torch.randn(6, 3 * num_heads * 16, generator=generator)
    x = qkv[:, num_heads * 16 : 2 * num_heads * 16].unflatten(-1, (num_heads, 16))
    weight = 1 + 0.3 * torch.randn(num_heads * 16 if scope == "row" else 16, generator=generator)
    for table_shape in ((6, 8), (6, num_heads, 8)):  # shared by the heads, or each head its own
        angles = torch.randn(*table_shape, generator=generator)
        want = qk_norm_rotary_reference(x, weight, angles.cos(), angles.sin(), 1e-6, scope)
        got = run_triton(x, weight, angles.cos(), angles.sin(), 1e-6, scope)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
print("ok")
"""
    run_under_interpreter(code)


@needs_triton
def test_compile_sees_the_kernel_for_its_cache_key():
    from mstar.engine.kernels.qk_norm_rotary_triton import qk_norm_rotary_kernel

    assert_op_names_its_kernel("mstar::qk_norm_rotary", qk_norm_rotary_kernel)


@pytest.mark.gpu
def test_inductor_launches_the_kernel_from_the_compiled_graph():
    """Under torch.compile the op is not a call back into Python: the output code launches the
    Triton kernel itself, one graph for every pack length, same values as the op run eagerly."""
    weight = (torch.rand(128) + 0.5).bfloat16().cuda()

    def norm_rotate(x, cos, sin):
        return torch.ops.mstar.qk_norm_rotary(x, weight, cos, sin, 1e-6, "head") * 2

    arg_sets = [
        tuple(t.cuda() for t in _inputs(num_tokens, 30, 128, torch.bfloat16, seed=num_tokens)[:3])
        for num_tokens in (300, 517)
    ]
    assert_inductor_launches("qk_norm_rotary_kernel", norm_rotate, arg_sets)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("scope", "num_heads", "head_tables"), [("row", 24, False), ("head", 30, False), ("row", 32, True)]
)
def test_triton_kernel_on_cuda_matches_the_definition_in_bf16(scope, num_heads, head_tables):
    """Wan 5B (24 heads, norm over the row), Z-Image (30 heads, norm per head) and LTX-2 (32 heads,
    norm over the row, per-head tables) at 4k tokens."""
    x, cos, sin, generator = _inputs(4104, num_heads, 128, torch.bfloat16)
    if head_tables:
        angles = torch.randn(4104, num_heads, 64, generator=generator)
        cos, sin = angles.cos(), angles.sin()
    weight = (
        1 + 0.3 * torch.randn(num_heads * 128 if scope == "row" else 128, generator=generator)
    ).bfloat16()
    x, cos, sin, weight = x.cuda(), cos.cuda(), sin.cuda(), weight.cuda()
    want = qk_norm_rotary_reference(x, weight, cos, sin, 1e-6, scope)
    got = qk_norm_rotary(x, weight, cos, sin, 1e-6, scope)
    assert got.is_contiguous() and got.shape == x.shape
    # A normed value may round the other way (rsqrt, fused multiply-adds): one bf16 step of the
    # normed values (|y| < 8: 2**-5), which the rotation carries whole into outputs near zero.
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-5)
    assert (got != want).float().mean().item() < 0.02


def test_kernels_take_effect_on_cuda_with_triton_only(monkeypatch, caplog):
    """Without Triton the models keep their PyTorch code, with one warning, instead of failing."""
    import importlib.util as importlib_util

    from mstar.engine import kernels

    real_find_spec = importlib_util.find_spec
    assert not kernels.triton_kernels_usable("cpu")
    monkeypatch.setattr(
        kernels.importlib.util, "find_spec", lambda name: None if name == "triton" else real_find_spec(name)
    )
    with caplog.at_level("WARNING", logger="mstar.engine.kernels"):
        assert not kernels.triton_kernels_usable("cuda:0")
    assert "Triton is not installed" in caplog.text
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: object())
    assert kernels.triton_kernels_usable("cuda")
