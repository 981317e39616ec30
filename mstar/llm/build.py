"""Build the LLM node in a worker: the KV pool (sized after the weights), attention over it, the
sampler, the scheduler and, on CUDA, decode graphs captured at warmup.

    node = build_llm_node(ctx, model, geometry, tokenizer, eos_ids, context_length, dtype, compiled=parts)

`compiled` (the CompiledParts of a model whose forward calls compiled functions) is compiled at
the node's warmup, before the decode graphs are captured (mstar.llm.warmup).

`geometry` is the model's LLMGeometry (layers, heads, kv heads, head dim, vocabulary): all the
engine needs to know of it. The model must already be on the device (its weights are what the
pool's sizing leaves out).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from mstar.engine.compile import effective_mode
from mstar.engine.kv.attention import PagedHeads
from mstar.engine.kv.build import build_paged_attention, use_flashinfer_cache
from mstar.engine.kv.pool import GIB, KVGeometry, build_kv_pool
from mstar.graph import BuildContext
from mstar.llm.graphs import DecodeGraphs, default_graph_sizes, graph_page_indices
from mstar.llm.node import LLMNode
from mstar.llm.runner import ModelRunner
from mstar.llm.sampling import Sampler
from mstar.llm.scheduler import Scheduler, SchedulerConfig
from mstar.llm.warmup import LLMWarmup

log = logging.getLogger("mstar.llm")
CPU_KV_BUDGET_BYTES = (
    2 * GIB
)  # a CPU server shares its host: the pool takes at most this unless kv_pool_pages says


@dataclass(frozen=True)
class LLMGeometry:
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def build_llm_node(
    ctx: BuildContext,
    model: torch.nn.Module,
    geometry: LLMGeometry,
    tokenizer: Any,
    eos_ids: tuple[int, ...],
    context_length: int,
    dtype: torch.dtype,
    name: str = "llm",
    overlap: bool | None = None,
    compiled: Any = None,
) -> LLMNode:
    """`overlap` (default: on CUDA) queues each step before the previous one is read back."""
    config = ctx.config
    device = torch.device(ctx.device)
    if device.type == "cuda":
        use_flashinfer_cache(config.compile_cache_dir)
    workspace = _workspace(device, config.workspace_mb)
    kv_geometry = KVGeometry(
        geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, dtype, config.kv_page_tokens
    )
    pages_per_request = -(-context_length // config.kv_page_tokens)
    pool = build_kv_pool(
        kv_geometry,
        device,
        num_pages=config.kv_pool_pages,
        memory_fraction=config.kv_cache_memory_fraction,
        max_useful_pages=config.max_num_seqs * pages_per_request,
        min_pages=pages_per_request,
        enable_prefix_cache=config.enable_prefix_caching,
        memory_cap_bytes=CPU_KV_BUDGET_BYTES if device.type == "cpu" else None,
    )
    heads = PagedHeads(
        geometry.num_q_heads, geometry.num_kv_heads, geometry.head_dim, dtype, config.kv_page_tokens,
        geometry.head_dim**-0.5,
    )  # fmt: skip
    use_graphs = config.cuda_graphs and device.type == "cuda"
    scheduler_config = SchedulerConfig(
        config.max_num_seqs, max(config.max_num_batched_tokens, config.max_num_seqs)
    )
    graph_sizes = default_graph_sizes(config.max_num_seqs, scheduler_config.max_num_batched_tokens)
    attention = build_paged_attention(
        pool, heads, config.kv_attention_backend, flashinfer_backend=config.flashinfer_backend,
        workspace=workspace, cuda_graphs=use_graphs,
        max_graph_page_indices=graph_page_indices(pool.num_pages, config.kv_page_tokens, graph_sizes[-1]),
    )  # fmt: skip
    graphs = None
    if use_graphs and attention.backend_name == "flashinfer":
        graphs = DecodeGraphs(model, attention, graph_sizes)
    sampler = Sampler(geometry.vocab_size, device, effective_mode(config.compile_mode, str(device)))
    runner = ModelRunner(model, attention, sampler, graphs)
    scheduler = Scheduler(scheduler_config, pool.pages)
    warmup = LLMWarmup(model, attention, sampler, graphs, compiled, scheduler_config.max_num_batched_tokens)
    overlap = device.type == "cuda" if overlap is None else overlap
    return LLMNode(
        name, runner, scheduler, tokenizer, eos_ids, context_length, warmup_steps=warmup, overlap=overlap
    )


def use_one_cpu_thread(device: str | torch.device) -> None:
    """A CPU worker serving an LLM runs torch on one thread: a decode step is a few small GEMMs,
    and OpenMP's thread team costs more than it gives (a 16-row tiny-chat step took 35 ms on one
    thread against 780 ms on two, on a busy 2-core host). Process-wide: call it in workers only."""
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)


def _workspace(device: torch.device, workspace_mb: int) -> torch.Tensor | None:
    """FlashInfer's scratch on CUDA (the shared one, allocated before the pool's sizing)."""
    if device.type != "cuda":
        return None
    from mstar.engine.workspace import shared_workspace

    return shared_workspace(device, workspace_mb)
