"""transformers' batched `generate` on the same random weights: the LLM benchmark's baseline.

The weights are ours (mstar.models.qwen3 seeded random weights, the same seed as the server's),
loaded into transformers' Qwen3ForCausalLM by name; each batch is B prompts of the same length
(no padding), greedy, exactly max_new_tokens new tokens (EOS ignored), default attention (SDPA)
and the default dynamic cache. Timed around generate (the device synchronized), after one warm-up call.
"""

from __future__ import annotations

import time
from typing import Any

from mstar.bench.llm_load import random_prompts


def transformers_model(config: Any, device: str, seed: int = 0, dtype: Any = None):
    """transformers' Qwen3ForCausalLM holding our seeded random weights (bf16 values; in `dtype`,
    bf16 by default, on `device`)."""
    import torch
    import transformers

    from mstar.models.qwen3.nodes import load_qwen3

    dtype = dtype or torch.bfloat16
    ours = load_qwen3(config, device, torch.bfloat16, seed=seed)
    with torch.device(device):  # not meta: the rotary buffers are computed at construction
        model = transformers.Qwen3ForCausalLM._from_config(
            transformers.Qwen3Config(**config.to_hf()), dtype=dtype
        )
    model.load_state_dict(dict(ours.state_dict()), strict=True)  # lm_head is listed even when tied
    del ours
    model.generation_config.eos_token_id = None
    return model.eval()


def run_baseline(
    config: Any, device: str, batch_sizes: list[int], prompt_tokens: int, output_tokens: int, seed: int
) -> list[dict]:
    import torch

    model = transformers_model(config, device, seed)
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
