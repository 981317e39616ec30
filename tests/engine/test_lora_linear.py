"""The segmented LoRA linear: a packed batch of segments with different adapters (or none) equals
each segment alone and the per-segment definition; fused slices equal separate projections; base
outputs stay byte-identical with no adapter; a new adapter compiles nothing."""

import copy

import pytest
import torch
from torch import nn

from mstar.engine.compile import CompiledFunction
from mstar.engine.lora.linear import LoraRows, reference_lora_delta
from mstar.engine.lora.paths import LINEAR_PATHS, PATHS, choose_path, path_bytes_per_row
from mstar.engine.lora.weights import ModuleLora
from mstar.engine.lora.wrap import LoraLayers, LoraSlice, LoraTarget, linear_targets
from mstar.models.fusion import concat_linears

IN, OUT, MAX_RANK = 16, 24, 8


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, OUT), nn.GELU(), nn.Linear(OUT, IN, bias=False))


def _adapter(seed, rank, names=("0", "2")):
    generator = torch.Generator().manual_seed(seed)
    shapes = {"0": (OUT, IN), "2": (IN, OUT)}
    return {
        name: ModuleLora(
            torch.randn(rank, shapes[name][1], generator=generator),
            torch.randn(shapes[name][0], rank, generator=generator),
        )
        for name in names
    }


def _definition(model, x, segments):
    """y per segment from the adapters' own matrices: base + sum scale * x @ (up @ down).T per layer."""
    outs = []
    for rows, chosen in segments:
        h = x[rows]
        for index, layer in enumerate(model):
            if isinstance(layer, nn.Linear):
                update = sum(
                    scale * h @ (lora[str(index)].up @ lora[str(index)].down).T
                    for lora, scale in chosen
                    if str(index) in lora
                )
                h = layer(h) + update
            else:
                h = layer(h)
        outs.append(h)
    return torch.cat(outs)


@pytest.fixture(params=PATHS)
def wrapped(request):
    model = _model()
    base = copy.deepcopy(model)
    layers = LoraLayers(model, linear_targets(model), num_slots=3, max_rank=MAX_RANK, path=request.param)
    adapters = [_adapter(1, 4), _adapter(2, 8), _adapter(3, 2, names=("2",))]
    for slot, adapter in enumerate(adapters, start=1):
        layers.write(slot, layers.pack(adapter))
    return model, base, layers, adapters


def _segments(adapters):
    """Four segments: three adapters (one with two at once, one negative) and one with none."""
    a, b, c = adapters
    lengths = [5, 3, 7, 4]
    choices = [[(1, 0.8)], [(2, -0.5), (3, 1.5)], [], [(3, 0.3)]]
    lookup = {1: a, 2: b, 3: c}
    return lengths, choices, [[(lookup[slot], scale) for slot, scale in chosen] for chosen in choices]


def test_packed_segments_equal_the_definition_and_each_alone(wrapped):
    model, base, layers, adapters = wrapped
    lengths, choices, resolved = _segments(adapters)
    x = torch.randn(sum(lengths), IN)
    layers.context.set("tokens", LoraRows.build(lengths, choices, "cpu", torch.float32))
    with torch.no_grad():
        packed = model(x)
        starts = torch.tensor([0, *lengths]).cumsum(0).tolist()
        spans = [slice(starts[i], starts[i + 1]) for i in range(len(lengths))]
        expected = _definition(base, x, list(zip(spans, resolved, strict=True)))
        # float32 sums of the order of 100 (the float64 test checks every path tightly)
        torch.testing.assert_close(packed, expected, rtol=1e-4, atol=1e-4)
        for span, length, chosen in zip(spans, lengths, choices, strict=True):
            layers.context.set("tokens", LoraRows.build([length], [chosen], "cpu", torch.float32))
            torch.testing.assert_close(packed[span], model(x[span]), rtol=1e-4, atol=1e-4)
        assert torch.equal(packed[spans[2]], base(x)[spans[2]])  # no adapter: the base output, bytes


def test_grouped_path_equals_reference(wrapped):
    model, _, layers, adapters = wrapped
    lengths, choices, _ = _segments(adapters)
    rows = LoraRows.build(lengths, choices, "cpu", torch.float32)
    x = torch.randn(sum(lengths), IN)
    layer = layers.layers[0]
    from mstar.engine.lora.linear import grouped_lora_delta

    grouped = grouped_lora_delta(x, layer.lora_a, layer.lora_b(), rows)
    torch.testing.assert_close(grouped, reference_lora_delta(x, layer.lora_a, layer.lora_b(), rows))


def test_no_adapter_and_evicted_slots_leave_base_byte_identical(wrapped):
    model, base, layers, adapters = wrapped
    weights_before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(9, IN)
    with torch.no_grad():
        assert torch.equal(model(x), base(x))  # no context: the base layers alone
        lengths, choices, _ = _segments(adapters)
        layers.context.set("tokens", LoraRows.build([9], [[(1, 1.0)]], "cpu", torch.float32))
        assert not torch.equal(model(x), base(x))
        layers.clear(1)  # evicted
        layers.write(2, layers.pack(_adapter(9, 3)))  # another adapter replaces one
        layers.context.set("tokens", LoraRows.build([9], [[]], "cpu", torch.float32))
        assert torch.equal(model(x), base(x))
        layers.context.clear()
        assert torch.equal(model(x), base(x))
    assert set(model.state_dict()) == set(base.state_dict())  # same keys: never merged, not renamed
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights_before[key])


@pytest.mark.parametrize("path", PATHS)
def test_fused_projection_slices_equal_separate_projections(path):
    """q/k/v fused into one GEMM with q and k rows reordered: one slice per projection."""
    torch.manual_seed(0)
    separate = nn.ModuleDict({p: nn.Linear(IN, 8) for p in ("to_q", "to_k", "to_v")})
    order = torch.randperm(8)
    fused_parent = nn.Module()
    with torch.no_grad():
        parts = [copy.deepcopy(separate[p]) for p in ("to_q", "to_k", "to_v")]
        for part in parts[:2]:
            part.weight.copy_(part.weight[order])
            part.bias.copy_(part.bias[order])
    fused_parent.to_qkv = concat_linears(parts)
    slices = tuple(LoraSlice(p, 8, order if p != "to_v" else None) for p in ("to_q", "to_k", "to_v"))
    fused = LoraLayers(
        fused_parent, [LoraTarget("to_qkv", slices)], num_slots=1, max_rank=MAX_RANK, path=path
    )
    plain = LoraLayers(separate, linear_targets(separate), num_slots=1, max_rank=MAX_RANK, path="grouped")
    generator = torch.Generator().manual_seed(5)
    adapter = {
        p: ModuleLora(torch.randn(4, IN, generator=generator), torch.randn(8, 4, generator=generator))
        for p in separate
    }
    for layers in (fused, plain):
        layers.write(1, layers.pack(adapter))
        layers.context.set("tokens", LoraRows.build([3, 4], [[(1, 0.7)], []], "cpu", torch.float32))
    x = torch.randn(7, IN)
    with torch.no_grad():
        q, k, v = fused_parent.to_qkv(x).split(8, dim=1)
        torch.testing.assert_close(q, separate["to_q"](x)[:, order], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k, separate["to_k"](x)[:, order], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v, separate["to_v"](x), rtol=1e-5, atol=1e-5)


def test_rows_pad_to_two_segments_and_none_without_adapters():
    assert LoraRows.build([4, 5], [[], []], "cpu", torch.float32) is None
    rows = LoraRows.build([6], [[(2, 0.5)]], "cpu", torch.float32)
    assert rows.ends.tolist() == [6, 6] and rows.slots.tolist() == [[2], [0]]
    assert rows.step_slots.tolist() == [2, 0] and rows.mix.tolist() == [[[0.5, 0.0]], [[0.0, 0.0]]]
    rows = LoraRows.build([2, 3], [[(1, 1.0), (2, 0.5)], [(3, 2.0)]], "cpu", torch.float32)
    assert rows.slots.tolist() == [[1, 2], [3, 0]] and rows.scales.tolist() == [[1.0, 0.5], [2.0, 0.0]]
    assert rows.step_slots.tolist() == [1, 2, 3]
    assert rows.mix.tolist() == [[[1.0, 0.0, 0.0], [0.0, 0.5, 0.0]], [[0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("path", PATHS)
def test_every_path_equals_the_definition_in_float64(path, bias):
    """Two slices of different widths, a bias, segments of one and two adapters and none, and a
    uniform layout: base + reference_lora_delta to float64 precision (CPU has no float64 grouped
    GEMM: the segment loop)."""
    torch.manual_seed(0)
    parent = nn.Module()
    parent.p = nn.Linear(IN, OUT, bias=bias).double()
    base = copy.deepcopy(parent.p)
    target = LoraTarget("p", (LoraSlice("a", 8), LoraSlice("b", OUT - 8)))
    layers = LoraLayers(parent, [target], num_slots=3, max_rank=MAX_RANK, path=path)
    generator = torch.Generator().manual_seed(1)
    for slot, rank in ((1, 4), (2, 8), (3, 2)):
        adapter = {
            name: ModuleLora(
                torch.randn(rank, IN, generator=generator), torch.randn(width, rank, generator=generator)
            )
            for name, width in (("a", 8), ("b", OUT - 8))
        }
        layers.write(slot, layers.pack(adapter))
    lengths, choices, _ = _segments([None] * 3)
    x = torch.randn(sum(lengths), IN, dtype=torch.float64)
    layer = parent.p
    for rows in (
        LoraRows.build(lengths, choices, "cpu", torch.float64),
        LoraRows.uniform([(2, 0.7), (1, -0.2)], "cpu", torch.float64),
    ):
        layers.context.set("tokens", rows)
        with torch.no_grad():
            expected = base(x) + reference_lora_delta(x, layer.lora_a, layer.lora_b(), rows)
            torch.testing.assert_close(layer(x), expected, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(layer(x[None]), expected[None], rtol=1e-12, atol=1e-12)


def test_rule_picks_grouped_for_the_families_shapes_and_concat_only_where_it_moves_fewer_bytes():
    # every family shape at the bench's 4 slots of rank 32 (and the defaults, 8 of 64): grouped
    for i, o, j in ((3072, 3072, 1), (3072, 14336, 1), (3072, 9216, 3), (3840, 20480, 2), (3072, 27648, 1)):
        for slots, rank in ((4, 32), (8, 64)):
            assert choose_path(i, o, j, slots, rank, many_rows=True) == "grouped"
    # a very wide output, one slot of rank 8: the n-fold extra K and the weight copy are small
    assert choose_path(3072, 65536, 1, 1, 8, many_rows=True) == "concat"
    assert choose_path(3072, 65536, 1, 1, 8, many_rows=False) == "grouped"
    cost = path_bytes_per_row(3072, 9216, 3, 4, 32, 4096)
    assert cost["epilogue"] < cost["grouped"]  # the cat of three slices is gone


def test_pack_refuses_other_modules_shapes_and_ranks(wrapped):
    from mstar.adapters import AdapterFileError

    _, _, layers, _ = wrapped
    with pytest.raises(AdapterFileError, match="'9' is not one"):
        layers.pack({"9": _adapter(1, 2)["0"]})
    with pytest.raises(AdapterFileError, match="another model size"):
        layers.pack({"2": _adapter(1, 2)["0"]})
    with pytest.raises(AdapterFileError, match="above max_lora_rank"):
        layers.pack(_adapter(1, MAX_RANK + 1))


@pytest.mark.parametrize("path", PATHS)
def test_new_adapters_and_segments_compile_nothing(path):
    """One graph for steps with adapters (pack length, segment count, the step's distinct
    adapters, slots, scales and adapter contents all vary) and one for steps without; bf16, the
    dtype the grouped GEMM traces in."""
    model = _model().to(torch.bfloat16)
    layers = LoraLayers(model, linear_targets(model), num_slots=3, max_rank=MAX_RANK, path=path)
    layers.write(1, layers.pack(_adapter(1, 4)))
    compiled = CompiledFunction(
        model, "default", "lora-test", duck_shapes=False, backend=lambda gm, _: gm.forward
    )

    def step(lengths, choices):
        layers.context.set("tokens", LoraRows.build(lengths, choices, "cpu", torch.bfloat16))
        with torch.inference_mode():
            return compiled(torch.randn(sum(lengths), IN, dtype=torch.bfloat16))

    step([4, 6], [[], []])  # no adapters
    step([4, 6], [[(1, 1.0)], []])
    compiled.finish_warmup()
    layers.write(2, layers.pack(_adapter(2, 8)))  # a new adapter
    step([3, 5, 9], [[(2, 0.5)], [(1, 1.0)], []])
    layers.write(3, layers.pack(_adapter(3, 2)))
    step([7, 2, 2, 5], [[(3, -1.0)], [(2, 0.25)], [(1, 2.0)], [(3, 0.1)]])
    step([11], [[]])
    assert compiled.num_recompiles == 0
    assert compiled.num_compiles == 2  # one graph with adapters, one without: no graph breaks


def test_bench_runs_on_tiny_shapes(capsys):
    from mstar.engine.lora.bench import bench_load, bench_shape

    timings = bench_shape("tiny", ("q/k/v", 16, 48, 3, 2, 8), bias=True, labels=2, device="cpu")
    assert set(timings) == {"base", *LINEAR_PATHS}
    bench_load("tiny", 2, [(16, 48), (48, 16)], device="cpu")
    out = capsys.readouterr().out
    assert "rule picks grouped" in out and "copy to slot" in out
