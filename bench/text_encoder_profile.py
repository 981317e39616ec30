"""Diagnostic: where Z-Image's prompt encoding spends host time (cProfile), batch 1 and 2, on the GPU.

    PYTHONPATH=/tmp/site:. python3 bench/text_encoder_profile.py
"""

import cProfile
import pstats
import time

import torch

from mstar.models.zimage.config import REAL
from mstar.models.zimage.nodes import load_tokenizer
from mstar.models.zimage.text_encoder import PromptEncoder, build_qwen3

PROMPTS = ["a red fox running through fresh snow at dawn", "a hot air balloon drifting over green hills"]


def timed_ms(encoder, prompts, repeats=5):
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        encoder.encode(prompts)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - started) / repeats


model = build_qwen3(REAL.text_encoder, "cuda", torch.bfloat16)
encoder = PromptEncoder(model, load_tokenizer(None, REAL), "cuda", REAL.max_sequence_length)
print("attn implementation:", model.config._attn_implementation)
for grad_mode in ("no_grad", "inference_mode"):
    context = torch.inference_mode() if grad_mode == "inference_mode" else torch.no_grad()
    with context:
        for prompts in (PROMPTS[:1], PROMPTS):
            timed_ms(encoder, prompts, 2)
            print(f"{grad_mode} batch {len(prompts)}: {timed_ms(encoder, prompts):.1f} ms")
profiler = cProfile.Profile()
with torch.no_grad():
    profiler.enable()
    for _ in range(3):
        encoder.encode(PROMPTS)
    torch.cuda.synchronize()
    profiler.disable()
pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
