"""mstar::lora_activation: an FFN Linear's per-segment LoRA expand applied inside its activation
equals the grouped path followed by the activation (the definition on the CPU, in float64 and
float32), checks its inputs, and the Triton kernel computes the definition (under Triton's CPU
interpreter here when Triton is installed: tiles straddling segments, segments without adapters,
several adapters a segment; on CUDA in bf16 at Wan's and Z-Image's sizes in the gpu tier)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mstar.engine.kernels.lora_activation  # noqa: F401  registers the op
from mstar.engine.kernels.lora_activation import lora_activation_reference
from mstar.engine.lora.activation import fuses_lora, lora_activation
from mstar.engine.lora.linear import LoraRows, grouped_lora_delta, reference_lora_delta
from mstar.engine.lora.weights import ModuleLora
from mstar.engine.lora.wrap import LoraLayers, LoraSlice, LoraTarget
from tests.engine.kernel_checks import (
    assert_inductor_launches,
    assert_op_names_its_kernel,
    needs_triton,
    run_under_interpreter,
)

# segments: one adapter, two at once (K = 2), an empty one, none, a negative scale
LENGTHS = [5, 9, 0, 7, 4]
CHOICES = [[(1, 0.8)], [(2, -0.5), (3, 1.5)], [], [], [(3, -0.3)]]


def _layer(in_features, hidden, num_slices, rank, dtype, device="cpu", bias=True, path="activation"):
    """A wrapped Linear in -> num_slices x hidden with three random adapters in its slots."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.proj = nn.Linear(in_features, num_slices * hidden, bias=bias).to(device, dtype)
    slices = tuple(LoraSlice(f"s{index}", hidden) for index in range(num_slices))
    layers = LoraLayers(parent, [LoraTarget("proj", slices)], num_slots=3, max_rank=rank, path=path)
    generator = torch.Generator().manual_seed(1)
    for slot in (1, 2, 3):
        adapter = {
            piece.source: ModuleLora(
                torch.randn(rank - slot + 1, in_features, generator=generator) / in_features**0.5,
                torch.randn(hidden, rank - slot + 1, generator=generator) / rank**0.5,
            )
            for piece in slices
        }
        layers.write(slot, layers.pack(adapter))
    return parent.proj, layers


def _activated(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("activation,num_slices", [("gelu_tanh", 1), ("swiglu", 2)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_activation_equals_the_grouped_path_then_the_activation(activation, num_slices, dtype):
    layer, layers = _layer(16, 24, num_slices, 8, dtype)
    x = torch.randn(sum(LENGTHS), 16, dtype=dtype)
    assert not fuses_lora(layer)  # no rows for the step: the consumer keeps its plain code
    for rows in (
        LoraRows.build(LENGTHS, CHOICES, "cpu", dtype),
        LoraRows.uniform([(2, 0.7), (1, -0.2)], "cpu", dtype),  # one segment over every row
    ):
        layers.context.set("tokens", rows)
        assert fuses_lora(layer)
        with torch.no_grad():
            got = lora_activation(layer, x, activation)
            want = _activated(layer(x), activation)  # the layer alone: the grouped path
            tolerance = 1e-12 if dtype == torch.float64 else 1e-5
            torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
            torch.testing.assert_close(lora_activation(layer, x[None], activation), got[None])
            if dtype == torch.float32:  # against the grouped GEMMs themselves
                delta = grouped_lora_delta(x, layer.lora_a, layer.lora_b(), rows)
                base = F.linear(x, layer.weight, layer.bias)
                torch.testing.assert_close(got, _activated(base + delta, activation), rtol=1e-5, atol=1e-5)
    rows = LoraRows.build(LENGTHS, CHOICES, "cpu", dtype)
    layers.context.set("tokens", rows)
    with torch.no_grad():  # rows without adapters: the base Linear's activation
        none = slice(14, 21)
        plain = _activated(F.linear(x, layer.weight, layer.bias), activation)
        torch.testing.assert_close(lora_activation(layer, x, activation)[none], plain[none])


def test_only_the_activation_path_fuses():
    layer, layers = _layer(16, 24, 1, 8, torch.float32, path="grouped")
    layers.context.set("tokens", LoraRows.build(LENGTHS, CHOICES, "cpu", torch.float32))
    assert not fuses_lora(layer) and not fuses_lora(nn.Linear(4, 4))


def _op_inputs(num_rows, width, num_slices, block, ends, dtype=torch.float32, seed=0):
    """Random y, hidden and b_seg; segment 1's B is zero (a segment without adapters)."""
    generator = torch.Generator().manual_seed(seed)
    num_segments = len(ends)
    y = torch.randn(num_rows, num_slices * width, generator=generator).to(dtype)
    hidden = torch.randn(num_rows, num_slices * block, generator=generator).to(dtype)
    b_seg = (torch.randn(num_segments, num_slices, block, width, generator=generator) / 4).to(dtype)
    b_seg[1] = 0
    return y, hidden, b_seg, torch.tensor(ends, dtype=torch.int32)


def test_bad_inputs_are_named():
    op = torch.ops.mstar.lora_activation
    y, hidden, b_seg, ends = _op_inputs(10, 8, 2, 16, [4, 10])
    with pytest.raises(ValueError, match="activation must be one of"):
        op(y, hidden, b_seg, ends, "relu")
    with pytest.raises(ValueError, match=r"b_seg must be \[S, 1"):
        op(y, hidden, b_seg, ends, "gelu_tanh")
    with pytest.raises(ValueError, match="y must be"):
        op(y[:, :8], hidden, b_seg, ends, "swiglu")
    with pytest.raises(ValueError, match="hidden must be"):
        op(y, hidden[:, :16], b_seg, ends, "swiglu")
    with pytest.raises(ValueError, match="ends must be int32"):
        op(y, hidden, b_seg, ends.long(), "swiglu")
    with pytest.raises(ValueError, match="share a dtype"):
        op(y, hidden.double(), b_seg, ends, "swiglu")


def test_definition_adds_each_rows_segment_update():
    """The one-hot definition against a loop over the segments (an empty one included)."""
    y, hidden, b_seg, ends = _op_inputs(13, 8, 2, 16, [4, 4, 9, 13], torch.float64)
    want = y.clone()
    start = 0
    for segment, end in enumerate(ends.tolist()):
        for index in range(2):
            columns = slice(index * 8, (index + 1) * 8)
            want[start:end, columns] += (
                hidden[start:end, index * 16 : (index + 1) * 16] @ b_seg[segment, index]
            )
        start = end
    got = lora_activation_reference(y, hidden, b_seg, ends, "swiglu")
    torch.testing.assert_close(got, _activated(want, "swiglu"), rtol=1e-12, atol=1e-12)


@needs_triton
def test_triton_kernel_computes_the_definition_under_the_interpreter():
    """fp32 in a child process (TRITON_INTERPRET must be set before the kernel is built): 16-row
    tiles that segments straddle, an empty segment, one without adapters (zero B), K*R of 24 (a
    masked K block) and 48 (two K blocks), a partial column tile; then the default tiles."""
    code = """
import torch
from tests.engine.test_lora_activation import _op_inputs
from mstar.engine.kernels.lora_activation import lora_activation_reference, run_triton
cases = [((70, 40, 24, [10, 30, 30, 47, 70]), (16, 16, 4)), ((70, 40, 48, [3, 40, 70]), (16, 32, 4)),
         ((150, 136, 32, [100, 150]), None)]
for (num_rows, width, block, ends), tiles in cases:
    for activation, num_slices in (("gelu_tanh", 1), ("swiglu", 2)):
        y, hidden, b_seg, ends_t = _op_inputs(num_rows, width, num_slices, block, ends, seed=block)
        want = lora_activation_reference(y, hidden, b_seg, ends_t, activation)
        got = run_triton(y, hidden, b_seg, ends_t, activation, tiles)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""
    run_under_interpreter(code)


@needs_triton
def test_compile_sees_the_kernel_for_its_cache_key():
    from mstar.engine.kernels.lora_activation_triton import lora_activation_kernel

    assert_op_names_its_kernel("mstar::lora_activation", lora_activation_kernel)


def _bf16_error(activation, in_features, hidden, num_slices, lengths, choices):
    """(fused, grouped) max and mean errors against float32 from the same bf16 weights and input."""
    layer, layers = _layer(in_features, hidden, num_slices, 32, torch.bfloat16, "cuda")
    x = torch.randn(sum(lengths), in_features, device="cuda", dtype=torch.bfloat16)
    layers.context.set("tokens", LoraRows.build(lengths, choices, "cuda", torch.bfloat16))
    with torch.inference_mode():
        fused = lora_activation(layer, x, activation).float()
        grouped = _activated(layer(x), activation).float()
        rows32 = LoraRows.build(lengths, choices, "cuda", torch.float32)
        a, bs = layer.lora_a.float(), [b.float() for b in layer.lora_b()]
        y32 = F.linear(x.float(), layer.weight.float(), None if layer.bias is None else layer.bias.float())
        truth = _activated(y32 + reference_lora_delta(x.float(), a, bs, rows32), activation)
    errors = [(out - truth).abs() for out in (fused, grouped)]
    snr_db = 10 * torch.log10(truth.pow(2).mean() / (fused - truth).pow(2).mean())
    return errors, snr_db.item()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "activation,in_features,hidden,num_slices,bias",
    [("gelu_tanh", 3072, 14336, 1, True), ("swiglu", 3840, 10240, 2, False)],
    ids=["wan-ffn-in", "zimage-w13"],
)
def test_fused_activation_on_cuda_is_as_accurate_as_the_grouped_path_in_bf16(
    activation, in_features, hidden, num_slices, bias
):
    """Real widths, rank 32, a pack whose segments straddle tiles (one without adapters, one with
    two): the fused kernel's error against float32 is at most the grouped path's (it rounds once)."""
    lengths = [4100, 3000, 1500, 2613]
    choices = [[(1, 1.0)], [], [(2, 0.5), (3, 0.8)], [(3, -1.0)]]
    (fused, grouped), snr_db = _bf16_error(activation, in_features, hidden, num_slices, lengths, choices)
    assert snr_db >= 40
    assert fused.max() <= 1.5 * grouped.max() and fused.mean() <= 1.05 * grouped.mean()


@pytest.mark.gpu
def test_inductor_launches_the_kernel_from_the_compiled_graph():
    def fused(y, hidden, b_seg, ends):
        return torch.ops.mstar.lora_activation(y, hidden, b_seg, ends, "swiglu")

    def inputs(num_rows, ends):
        tensors = _op_inputs(num_rows, 256, 2, 32, ends, torch.bfloat16)
        return tuple(tensor.cuda() for tensor in tensors)

    arg_sets = [inputs(300, [100, 120, 300]), inputs(517, [17, 200, 201, 517])]
    assert_inductor_launches("lora_activation_kernel", fused, arg_sets)


@pytest.mark.gpu
def test_compiled_fused_ffn_matches_the_grouped_path_and_never_recompiles():
    """Wan's FFN in (3072 -> 14336, GELU) compiled with inductor: one graph for every pack of
    adapters (segments, slots, scales and contents vary), within bf16 tolerance of the grouped path."""
    from mstar.engine.compile import CompiledFunction

    layer, layers = _layer(3072, 14336, 1, 32, torch.bfloat16, "cuda")

    def ffn_in(x):
        if fuses_lora(layer):
            return lora_activation(layer, x, "gelu_tanh")
        return F.gelu(layer(x), approximate="tanh")

    compiled = CompiledFunction(ffn_in, "deterministic", "lora-activation-gpu", duck_shapes=False)

    def step(lengths, choices):
        layers.context.set("tokens", LoraRows.build(lengths, choices, "cuda", torch.bfloat16))
        x = torch.randn(sum(lengths), 3072, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            got = compiled(x).float()
            layer.lora_path = "grouped"
            want = F.gelu(layer(x), approximate="tanh").float()
            layer.lora_path = "activation"
        error = (got - want).pow(2).mean() / want.pow(2).mean()
        assert error.item() < 1e-4  # >= 40 dB

    step([4096, 2048], [[(1, 1.0)], []])
    step([1024, 3000, 5], [[(2, 0.5)], [(3, 1.0), (1, 0.4)], [(1, 0.2)]])  # two adapters a segment
    compiled.finish_warmup()
    layers.write(2, layers.pack({"s0": ModuleLora(torch.randn(32, 3072) / 60, torch.randn(14336, 32) / 6)}))
    step([6240, 6240, 6240, 6240], [[(1, 1.0)], [(2, 1.0)], [(3, -1.0)], [(2, 0.3), (1, 0.5)]])
    step([700, 1300], [[(3, 0.8)], [(1, 1.0)]])
    torch.cuda.synchronize()
    assert compiled.num_recompiles == 0
