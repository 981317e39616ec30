"""Edits at c=1 against a running server: one cold request (the first edit after /ready), then
steady ones, each with the same reference images (seeded noise PNGs), multipart as the openai
client sends them. Around each request it scrapes /metrics: recompiles in traffic, and where the
cold edit's time went against a steady one's (each node's device ms, each walk's ms). Prints and
writes {"cold_ms", "steady_ms": [...], "p50_ms", "cold_over_steady", "recompiles", "cold", "steady"}.

    python3 bench/edit_latency.py --base-url http://127.0.0.1:8765 --model flux2-klein-4b \
        --num-references 2 --size 1024x1024 --num-steady 3 -o edit.json
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time

import httpx
import numpy as np
from PIL import Image

from mstar.bench.server_metrics import (
    node_breakdown,
    node_seconds_from_metrics,
    recompiles_from_metrics,
    stage_breakdown,
    stage_seconds_from_metrics,
)


def reference_png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", compress_level=1)
    return buffer.getvalue()


def scrape(client: httpx.Client) -> str:
    """The server's /metrics text ("" when it has none: the figures are then left out)."""
    try:
        response = client.get("/metrics")
    except httpx.HTTPError:
        return ""
    return response.text if response.status_code == 200 else ""


def breakdown(before: str, after: str, num_requests: int) -> dict:
    """Where the requests between two scrapes spent their time on the server."""
    return {
        "nodes": node_breakdown(
            node_seconds_from_metrics(before), node_seconds_from_metrics(after), num_requests
        ),
        "server_ms_per_request": stage_breakdown(
            stage_seconds_from_metrics(before), stage_seconds_from_metrics(after), num_requests
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", default="http://127.0.0.1:8765")
    parser.add_argument("--model", required=True)
    parser.add_argument("--num-references", type=int, default=2)
    parser.add_argument("--size", default="1024x1024", help="WxH of each reference (the output's too)")
    parser.add_argument("--num-steady", type=int, default=3)
    parser.add_argument("--steps", type=int, help="num_inference_steps (default: the model's)")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("-o", "--output", default="edit.json")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    images = [reference_png(width, height, seed) for seed in range(args.num_references)]
    files = [("image[]", (f"ref{i}.png", data, "image/png")) for i, data in enumerate(images)]
    fields = {
        "model": args.model,
        "prompt": "put the two subjects side by side",
        "response_format": "b64_json",
    }
    if args.steps is not None:
        fields["num_inference_steps"] = str(args.steps)
    times_ms, scrapes = [], []
    with httpx.Client(base_url=args.base_url, timeout=args.timeout) as client:
        scrapes.append(scrape(client))
        for index in range(1 + args.num_steady):
            started = time.perf_counter()
            response = client.post("/v1/images/edits", data={**fields, "seed": str(index)}, files=files)
            response.raise_for_status()
            times_ms.append(1000 * (time.perf_counter() - started))
            scrapes.append(scrape(client))
            print(f"edit {index}: {times_ms[-1]:.0f} ms, size {response.json().get('size')}", flush=True)
    steady_ms = times_ms[1:]
    p50_ms = statistics.median(steady_ms) if steady_ms else None
    recompiles = [recompiles_from_metrics(text) if text else None for text in scrapes]
    result = {
        "model": args.model, "num_references": args.num_references, "reference_size": args.size,
        "num_inference_steps": args.steps,
        "cold_ms": times_ms[0], "steady_ms": steady_ms, "p50_ms": p50_ms,
        "cold_over_steady": times_ms[0] / p50_ms if p50_ms else None,
        "recompiles": {"at_start": recompiles[0], "after_cold": recompiles[1], "at_end": recompiles[-1]},
        "cold": breakdown(scrapes[0], scrapes[1], 1),
        "steady": breakdown(scrapes[1], scrapes[-1], len(steady_ms)) if steady_ms else None,
    }  # fmt: skip
    with open(args.output, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
