"""Wan's prompt encoder (UMT5-XXL, the real config, seeded random weights) per prompt on the GPU:
CUDA-graph replays (as served) and eager, for prompts that land in different length buckets.
A prompt is padded to its bucket with the padding masked, so its cost is its bucket's: the
longest prompt here replays the 512 graph, which is what padding every prompt to the pipeline's
512 tokens would cost.

    PYTHONPATH=$PWD python3 -m mstar.bench.prompt_encoder_speed [--num-timed 20] [-o out.json]

Prints one row per prompt: tokens, bucket, device ms (CUDA events around `encode([prompt])`:
the host gather of the prompt's embedding rows, the copy, the forward) and host ms.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PROMPTS = {
    "empty (the negative prompt)": "",
    "short": "a red fox in the snow",
    "33 tokens": "a tiny red fox runs through fresh snow at dawn, cinematic shot, soft light, detailed fur",
    "long (past 256 tokens)": "a lighthouse on a rocky coast during a storm, waves crashing " * 30,
}


def measure(num_timed: int, device: str = "cuda", config: Any = None) -> list[dict[str, Any]]:
    """One row per (mode, prompt); `config` a Wan22Config (default: the real one)."""
    import torch

    from mstar.bench.parity_tokenizers import umt5_tokenizer
    from mstar.bench.step import time_forward
    from mstar.models.wan22.config import Wan22Config
    from mstar.models.wan22.text_encoder import UMT5PromptEncoder, build_umt5

    config = config or Wan22Config()
    tokenizer = umt5_tokenizer(config.text_encoder["vocab_size"], config.max_text_tokens)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = build_umt5(config.text_encoder, device, dtype)
    rows = []
    for mode in ("cuda graphs", "eager"):
        encoder = UMT5PromptEncoder(
            model, tokenizer, device, config.max_text_tokens, cuda_graphs=mode != "eager"
        )
        encoder.warmup()
        for label, prompt in PROMPTS.items():
            num_tokens = encoder.tokenize(prompt).shape[1]
            with torch.inference_mode():
                timing = time_forward(lambda p=prompt, e=encoder: e.encode([p]), 3, num_timed, device)
            rows.append(
                {"mode": mode, "prompt": label, "num_tokens": num_tokens,
                 "bucket": encoder.hidden.bucket_for(num_tokens), "device_ms": timing["median_ms"],
                 "host_ms": timing.get("host_median_ms")}
            )  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| mode | prompt | tokens | bucket | device ms | host ms |", "|---|---|---|---|---|---|"]
    for row in rows:
        host = "-" if row["host_ms"] is None else f"{row['host_ms']:.2f}"
        lines.append(
            f"| {row['mode']} | {row['prompt']} | {row['num_tokens']} | {row['bucket']} | "
            f"{row['device_ms']:.2f} | {host} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-timed", type=int, default=20)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args(argv)
    rows = measure(args.num_timed)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"benchmark": "prompt-encoder-speed", "rows": rows}, indent=2))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
