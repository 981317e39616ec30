"""transformers' batched `generate` on the same random weights: the LLM benchmark's baseline.

The weights are ours (the family's seeded random weights, the same seed as the server's), loaded
into transformers' model by the family's bench entry (models/<family>/bench.py, a TextBenchEntry);
each batch is B prompts of the same length (no padding), greedy, exactly max_new_tokens new tokens (EOS ignored), default attention (SDPA)
and the default dynamic cache. Timed around generate (the device synchronized), after one warm-up call.
"""

from __future__ import annotations

import time
from typing import Any

from mstar.bench.llm_load import random_prompts


def transformers_model(model_name: str, config: Any, device: str, seed: int = 0, dtype: Any = None):
    """The registered model's reference (its family's TextBenchEntry) holding our seeded random
    weights, in `dtype` (bf16 by default) on `device`."""
    import torch

    from mstar.models.bench_entry import TextBenchEntry
    from mstar.models.registry import bench_entry

    entry = bench_entry(model_name)
    if not isinstance(entry, TextBenchEntry):
        raise ValueError(f"{model_name} has no text bench entry (models/registry.py)")
    return entry.reference_model(config, device, seed, dtype or torch.bfloat16)


def run_baseline(
    model_name: str,
    config: Any,
    device: str,
    batch_sizes: list[int],
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
) -> list[dict]:
    import torch

    model = transformers_model(model_name, config, device, seed)
    rows = []
    with torch.inference_mode():
        warm = torch.tensor(random_prompts(1, 16, config.vocab_size, seed), device=device)
        model.generate(warm, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
        for batch in batch_sizes:
            ids = torch.tensor(
                random_prompts(batch, prompt_tokens, config.vocab_size, seed + batch), device=device
            )
            _synchronize(device)
            started = time.perf_counter()
            out = model.generate(
                ids,
                max_new_tokens=output_tokens,
                min_new_tokens=output_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            _synchronize(device)
            seconds = time.perf_counter() - started
            generated = (out.shape[1] - prompt_tokens) * batch
            rows.append(
                {
                    "batch_size": batch,
                    "seconds": round(seconds, 3),
                    "output_tokens": generated,
                    "output_tokens_per_s": round(generated / seconds, 1),
                }
            )
            print(f"transformers batch {batch}: {rows[-1]}", flush=True)
    del model
    return rows


def _synchronize(device: str) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
