"""Z-Image's two compiled stacks (main layers, noise refiner) compile once each for every item
count, with outputs equal to eager (CPU; aot_eager runs the graph passes inductor runs, less its
kernels, so a restarted trace counts as a second compile)."""

import torch
import torch._dynamo

from mstar.diffusion.packing import pad_rows
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.models.zimage.config import TINY
from mstar.models.zimage.dit import DiTInput, ZImageDiT
from mstar.models.zimage.weights import build_dit

# as build_dit_node compiles them, with inductor replaced by aot_eager (no C++ build on the CPU)
SERVED_OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}


def _items(sizes):
    """sizes: (latent height, latent width, caption tokens) per item."""
    generator = torch.Generator().manual_seed(0)
    return [
        DiTInput(torch.randn(16, h, w, generator=generator), 0.2 + 0.1 * index,
                 torch.randn(n, TINY.dit.cap_feat_dim, generator=generator))
        for index, (h, w, n) in enumerate(sizes)
    ]  # fmt: skip


BATCHES = [[(12, 10, 7)], [(12, 10, 7)] * 2, [(12, 10, 7), (8, 8, 20), (10, 12, 3)], [(8, 8, 20)]]


def test_each_stack_compiles_once_for_every_item_count_and_matches_eager():
    dit = build_dit(TINY.dit, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    with torch.inference_mode():
        eager = [dit(_items(sizes), attention) for sizes in BATCHES]
        parts = compile_methods(
            dit, ZImageDiT.compiled_methods, "deterministic", "zimage.dit", **SERVED_OPTIONS
        )
        compiled = [dit(_items(sizes), attention) for sizes in BATCHES]
    assert [part.num_compiles for part in parts.parts] == [1, 1]
    for want, got in zip(eager, compiled, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_pad_rows_appends_zero_rows_up_to_the_minimum_only():
    rows = torch.randn(1, 3, 4)
    padded = pad_rows(rows)
    assert padded.shape == (2, 3, 4) and torch.equal(padded[0], rows[0]) and not padded[1].any()
    assert pad_rows(torch.randn(3, 4)).shape == (3, 4)


def test_a_size_after_warmup_compiles_nothing_and_per_item_parts_run_eagerly(monkeypatch):
    """The serving picture: warm one size, finish warmup, then sizes nobody listed. Patchify,
    rotary tables and unpatchify run per item outside the compiled stacks."""
    dit = build_dit(TINY.dit, "cpu", torch.float32)
    attention = build_attention("torch", "cpu", torch.float32)
    compiling_seen = []
    for name in ("_patchify", "_unpatchify", "_item_rope"):
        original = getattr(dit, name)
        monkeypatch.setattr(
            dit,
            name,
            lambda *args, _f=original: compiling_seen.append(torch.compiler.is_compiling()) or _f(*args),
        )
    with torch.inference_mode():
        parts = compile_methods(
            dit, ZImageDiT.compiled_methods, "deterministic", "zimage.dit", **SERVED_OPTIONS
        )
        dit(_items([(12, 10, 7)]), attention)
        dit(_items([(12, 10, 7)] * 2), attention)
        parts.finish_warmup()
        for sizes in ([(16, 12, 30)], [(8, 8, 20), (20, 16, 5)], [(10, 14, 9)]):
            dit(_items(sizes), attention)
    assert parts.num_recompiles == 0 and [part.num_compiles for part in parts.parts] == [1, 1]
    assert compiling_seen and not any(compiling_seen)
