"""Diagnostic: Z-Image's prompt step (Qwen3-4B, one prompt per forward) on the GPU, alone in a
process: its host time back to back, and after an idle gap, to tell the encoder's own cost from
what an idle machine adds (the server runs it after a gap at c=1). Then a cProfile of three forwards.

    PYTHONPATH=/tmp/site:. python3 bench/text_encoder_profile.py
"""

import cProfile
import pstats
import statistics
import time

import torch

from mstar.models.zimage.config import REAL
from mstar.models.zimage.nodes import load_tokenizer
from mstar.models.zimage.text_encoder import PromptEncoder, build_qwen3

PROMPT = "a red fox running through fresh snow at dawn"
GAP_S = 0.3


def spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def busy_gpu(seconds: float) -> None:
    """Keep the GPU busy (host asleep) for about `seconds`, then wait for it."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        a @ a
        torch.cuda.synchronize()


GAPS = {"back to back": lambda: None, "after sleep": lambda: time.sleep(GAP_S),
        "after CPU spin": lambda: spin(GAP_S), "after GPU busy": lambda: busy_gpu(GAP_S)}  # fmt: skip


def forward_ms(encoder, gap) -> tuple[float, float]:
    """(host ms of the call, ms until the device finished it)."""
    torch.cuda.synchronize()
    gap()
    torch.cuda.synchronize()
    started = time.perf_counter()
    encoder.encode([PROMPT])
    host_ms = 1000 * (time.perf_counter() - started)
    torch.cuda.synchronize()
    return host_ms, 1000 * (time.perf_counter() - started)


model = build_qwen3(REAL.text_encoder, "cuda", torch.bfloat16)
encoder = PromptEncoder(model, load_tokenizer(None, REAL), "cuda", REAL.max_sequence_length)
print("attn implementation:", model.config._attn_implementation)
for _ in range(3):
    encoder.encode([PROMPT])
for name, gap in GAPS.items():
    runs = [forward_ms(encoder, gap) for _ in range(6)]
    host = statistics.median(r[0] for r in runs)
    wall = statistics.median(r[1] for r in runs)
    print(f"{name:>14}: host {host:.1f} ms, until done {wall:.1f} ms (median of 6)")
profiler = cProfile.Profile()
profiler.enable()
for _ in range(3):
    encoder.encode([PROMPT])
torch.cuda.synchronize()
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
