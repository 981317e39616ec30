"""FlashInfer paged attention at Qwen3-8B's shape (32 query heads, 8 kv heads of 128, 16-token
pages, bf16), timed as a decode CUDA graph runs it: 36 calls (a layer stack) captured in one graph.

Two questions, each answered by time and by the output's agreement with an eager reference:
- a decode row (batch 1, 640 tokens of context): the tensor-core decode wrapper (what the server
  captures), the CUDA-core decode wrapper, either without split-kv, and a causal prefill wrapper in
  CUDA-graph mode whose batch is padded with empty segments;
- a prefix-cache hit's 32-token tail over a 2,048-token prefix: 32 decode rows each reading its
  whole context (what the server replays today) against one causal prefill segment of 32 queries
  in the same padded CUDA-graph prefill wrapper.

    python bench/paged_attention_probe.py        (on a GPU with flashinfer-python)
"""

from __future__ import annotations

import json
import sys

import torch

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, LAYERS = 32, 8, 128, 16, 36
DEVICE = torch.device("cuda")


def pool(num_pages: int) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    shape = (num_pages, 2, PAGE, KV_HEADS, HEAD_DIM)
    return torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.bfloat16)


def graph_us(run) -> float:
    """Microseconds a call, from a CUDA graph of LAYERS calls replayed 20 times."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAYERS):
            run()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (20 * LAYERS)


def reference(q: torch.Tensor, cache: torch.Tensor, rows: list[tuple[int, int, list[int]]]) -> torch.Tensor:
    """Eager fp32 causal attention over rows of (q_start, q_len, pages, kv_len)."""
    out = torch.empty_like(q, dtype=torch.float32)
    for q_start, q_len, pages, kv_len in rows:
        k = cache[pages, 0].reshape(-1, KV_HEADS, HEAD_DIM)[:kv_len].float()
        v = cache[pages, 1].reshape(-1, KV_HEADS, HEAD_DIM)[:kv_len].float()
        k, v = (t.repeat_interleave(Q_HEADS // KV_HEADS, dim=1).transpose(0, 1) for t in (k, v))
        qs = q[q_start : q_start + q_len].float().transpose(0, 1)
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=DEVICE).tril(kv_len - q_len)
        out[q_start : q_start + q_len] = torch.nn.functional.scaled_dot_product_attention(
            qs, k, v, attn_mask=mask, scale=HEAD_DIM**-0.5
        ).transpose(0, 1)
    return out


def table(segments: list[tuple[int, int]], first_page: int = 0) -> tuple:
    """int32 (qo_indptr, kv_indptr, indices, last_page_len) of segments (q_len, kv_len) whose pages
    are consecutive from first_page, plus the reference's rows."""
    qo, kv, indices, last, rows = [0], [0], [], [], []
    page = first_page
    for q_len, kv_len in segments:
        num = -(-kv_len // PAGE)
        pages = list(range(page, page + num))
        rows.append((qo[-1], q_len, pages, kv_len))
        indices += pages
        page += num
        qo.append(qo[-1] + q_len)
        kv.append(kv[-1] + num)
        last.append((kv_len - 1) % PAGE + 1)
    as_int = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    return as_int(qo), as_int(kv), as_int(indices), as_int(last), rows


def padded(qo, kv, last, batch: int) -> tuple:
    """The page table padded to `batch` segments with empty ones (no queries, no pages)."""
    extra = batch - (len(qo) - 1)
    qo = torch.cat([qo, qo[-1:].repeat(extra)])
    kv = torch.cat([kv, kv[-1:].repeat(extra)])
    last = torch.cat([last, torch.zeros(extra, dtype=torch.int32)])
    return qo, kv, last


def main() -> None:
    import flashinfer

    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=DEVICE)
    common = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    results: dict[str, object] = {"flashinfer": flashinfer.__version__}
    cache = pool(4096)

    def check(name: str, out: torch.Tensor, ref: torch.Tensor, us: float) -> None:
        err = ((out.float() - ref).norm() / ref.norm()).item()
        results[name] = {"us_per_call": round(us, 2), "rel_err": float(f"{err:.2e}")}
        print(f"{name:60s} {us:8.2f} us  rel err {err:.2e}", flush=True)

    def captured_prefill(batch: int, max_pages: int):
        bufs = dict(
            qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
            paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=DEVICE),
            paged_kv_indices_buf=torch.zeros(max_pages, dtype=torch.int32, device=DEVICE),
            paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device=DEVICE),
        )
        return flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, backend="fa2", **bufs
        )

    # ---- one decode row, 640 tokens of context -------------------------------------------
    qo, kv, idx, last, rows = table([(1, 640)])
    q1 = torch.randn(1, Q_HEADS, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    ref = reference(q1, cache, rows)
    for tensor_cores in (True, False):
        for no_split in (False, True):
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=tensor_cores
            )
            extra = {"disable_split_kv": True} if no_split else {}
            try:
                wrapper.plan(kv, idx, last, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, **common, **extra)
                out = wrapper.run(q1, cache)
                check(f"decode b1 ctx640 tensor_cores={tensor_cores} no_split={no_split}", out, ref,
                      graph_us(lambda w=wrapper: w.run(q1, cache)))  # fmt: skip
            except Exception as error:  # noqa: BLE001 - a probe reports what a variant refuses
                print(
                    f"decode tensor_cores={tensor_cores} no_split={no_split}: {type(error).__name__}: {error}"
                )
    for batch in (1, 8, 32):
        wrapper = captured_prefill(batch, 8192)
        pq, pkv, plast = padded(qo, kv, last, batch)
        wrapper.plan(pq, pkv, idx, plast, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, causal=True, **common)
        out = wrapper.run(q1, cache)
        check(f"captured causal prefill b1 ctx640 padded to {batch} segments", out, ref,
              graph_us(lambda w=wrapper: w.run(q1, cache)))  # fmt: skip

    # ---- a hit's tail: 32 new tokens after a 2,048-token prefix -----------------------------
    tail, prefix = 32, 2048
    q32 = torch.randn(tail, Q_HEADS, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    qo, kv, idx, last, rows = table([(tail, prefix + tail)])
    ref = reference(q32, cache, rows)
    pages = rows[0][2]
    ends = range(prefix + 1, prefix + tail + 1)
    dkv = torch.tensor(
        [0] + [sum(-(-e // PAGE) for e in ends[: i + 1]) for i in range(tail)], dtype=torch.int32
    )
    didx = torch.tensor([p for e in ends for p in pages[: -(-e // PAGE)]], dtype=torch.int32)
    dlast = torch.tensor([(e - 1) % PAGE + 1 for e in ends], dtype=torch.int32)
    decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    decode.plan(dkv, didx, dlast, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, **common)
    out = decode.run(q32, cache)
    check("tail 32 as decode rows (tensor cores)", out, ref, graph_us(lambda: decode.run(q32, cache)))
    for batch in (32, 128):
        wrapper = captured_prefill(batch, 8192)
        # the capture-time plan fixes the row count: plan the largest step first
        pq, pkv, plast = padded(*table([(1, 1)] * batch)[0:2], torch.ones(batch, dtype=torch.int32), batch)
        wrapper.plan(pq, pkv, torch.arange(batch, dtype=torch.int32), plast, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE,
                     causal=True, **common)  # fmt: skip
        pq, pkv, plast = padded(qo, kv, last, batch)
        wrapper.plan(pq, pkv, idx, plast, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, causal=True, **common)
        out = wrapper.run(q32, cache)
        check(f"tail 32 as one causal segment, captured, padded to {batch}", out, ref,
              graph_us(lambda w=wrapper: w.run(q32, cache)))  # fmt: skip
    if len(sys.argv) < 2:
        json.dump(results, sys.stdout, indent=1)
        return
    with open(sys.argv[1], "w") as out:
        json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
