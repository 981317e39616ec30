"""Wan's layer stack compiles once for every item count (CPU; aot_eager runs the graph passes
inductor runs, less its kernels, so a restarted trace counts as a second compile): one item alone,
pairs, four items of three sizes, an image-to-video item."""

import torch
import torch._dynamo

from mstar.diffusion.packing import MIN_COMPILED_ROWS
from mstar.engine.attention import build_attention
from mstar.engine.compile import compile_methods
from mstar.models.wan22.config import tiny_wan22_config
from mstar.models.wan22.dit import DiTInput, WanDiT

# as build_dit_node compiles them, with inductor replaced by aot_eager (no C++ build on the CPU)
SERVED_OPTIONS = {
    "persistent_rows": True,
    "duck_shapes": False,
    "backend": torch._dynamo.lookup_backend("aot_eager"),
}


def _item(frames: int, height: int, width: int, timestep: float = 999.0, num_clean_frames: int = 0):
    generator = torch.Generator().manual_seed(frames * 100 + height * 10 + width)
    latents = torch.randn(16, frames, height, width, generator=generator)
    return DiTInput(latents, timestep, torch.randn(16, 16, generator=generator), num_clean_frames)


BATCHES = [
    [_item(2, 8, 12)],  # one item: one timestep row
    [_item(2, 8, 12), _item(2, 8, 12, 500.0)],
    [_item(2, 12, 8)] * 2,
    [_item(2, 8, 12), _item(2, 12, 8), _item(3, 8, 8, 5.0), _item(2, 8, 12, 300.0)],
    [_item(3, 8, 8, num_clean_frames=1)],  # image to video: a clean-frame row
    [_item(2, 12, 8)],
]


def test_one_compile_serves_every_item_count_and_matches_eager():
    torch.manual_seed(0)
    dit = WanDiT(tiny_wan22_config().dit).eval()
    attention = build_attention("torch", "cpu", torch.float32)
    with torch.inference_mode():
        eager = [dit(batch, attention) for batch in BATCHES]
        (part,) = compile_methods(
            dit, WanDiT.compiled_methods, "deterministic", "wan.dit", **SERVED_OPTIONS
        ).parts
        compiled = [dit(batch, attention) for batch in BATCHES]
    assert part.num_compiles == 1
    for want, got in zip(eager, compiled, strict=True):
        for a, b in zip(want, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_one_item_gets_a_padding_row_that_no_token_reads():
    timesteps, row_index = WanDiT._timestep_rows([_item(2, 8, 12, 700.0)], [(1, 4, 6)], [24])
    assert timesteps.tolist() == [700.0, 0.0] and len(timesteps) == MIN_COMPILED_ROWS
    assert row_index.tolist() == [0] * 24


def test_a_size_after_warmup_compiles_nothing_and_per_item_parts_run_eagerly(monkeypatch):
    """The serving picture: warm one size, finish warmup, then sizes nobody listed. Patchify,
    rotary tables and unpatchify run per item outside the compiled stack."""
    torch.manual_seed(0)
    dit = WanDiT(tiny_wan22_config().dit).eval()
    attention = build_attention("torch", "cpu", torch.float32)
    compiling_seen = []
    for name in ("_grid_rotary", "_unpatchify"):
        original = getattr(dit, name)
        monkeypatch.setattr(
            dit,
            name,
            lambda *args, _f=original: compiling_seen.append(torch.compiler.is_compiling()) or _f(*args),
        )
    dit.patch_embedding.register_forward_hook(lambda *_: compiling_seen.append(torch.compiler.is_compiling()))
    with torch.inference_mode():
        parts = compile_methods(dit, WanDiT.compiled_methods, "deterministic", "wan.dit", **SERVED_OPTIONS)
        dit([_item(2, 8, 12)], attention)
        dit([_item(2, 8, 12)] * 2, attention)
        parts.finish_warmup()
        for batch in (
            [_item(3, 12, 16)],
            [_item(5, 8, 8), _item(2, 16, 12, 10.0)],
            [_item(3, 8, 8, num_clean_frames=1)],
        ):
            dit(batch, attention)
    assert parts.num_recompiles == 0 and [part.num_compiles for part in parts.parts] == [1]
    assert compiling_seen and not any(compiling_seen)
