"""Diagnostic: Z-Image's prompt step (Qwen3-4B, one prompt per forward) on the GPU, alone in a
process: its host time back to back, and after an idle gap, to tell the encoder's own cost from
what an idle machine adds (the server runs it after a gap at c=1); eager, then replaying CUDA
graphs (cuda_graphs, with the largest difference from eager). Then a cProfile of three forwards.

    PYTHONPATH=/tmp/site:. python3 bench/text_encoder_profile.py
"""

import cProfile
import pstats
import statistics
import time

import torch

from mstar.models.text_fallback import load_tokenizer
from mstar.models.zimage.config import REAL
from mstar.models.zimage.text_encoder import Qwen3PromptEncoder, build_qwen3

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
tokenizer = load_tokenizer(None, REAL.text_encoder["vocab_size"], REAL.max_sequence_length, add_eos=False)
encoder = Qwen3PromptEncoder(model, tokenizer, "cuda", REAL.max_sequence_length)
graphed = Qwen3PromptEncoder(model, tokenizer, "cuda", REAL.max_sequence_length, cuda_graphs=True)
started = time.perf_counter()
graphed.warmup()
print(f"attn implementation: {model.config._attn_implementation}; graphs captured in "
      f"{time.perf_counter() - started:.2f} s; prompt tokens {encoder.tokenize(PROMPT).shape[1]}")  # fmt: skip
for label, timed in (("eager", encoder), ("CUDA graphs", graphed)):
    for _ in range(3):
        timed.encode([PROMPT])
    for name, gap in GAPS.items():
        runs = [forward_ms(timed, gap) for _ in range(6)]
        host = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{label:>11} {name:>14}: host {host:.1f} ms, until done {wall:.1f} ms (median of 6)")
for prompt in (PROMPT, "a city street at night in the rain, neon reflections " * 6):
    want, got = encoder.encode([prompt])[0].float(), graphed.encode([prompt])[0].float()
    print(f"graphs vs eager, {want.shape[0]} tokens: max abs diff {(got - want).abs().max().item():.4f}, "
          f"max abs {want.abs().max().item():.2f}")  # fmt: skip
profiler = cProfile.Profile()
profiler.enable()
for _ in range(3):
    encoder.encode([PROMPT])
torch.cuda.synchronize()
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
