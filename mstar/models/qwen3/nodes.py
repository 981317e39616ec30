"""Build Qwen3's llm node: the model straight onto its device (safetensors, or seeded random
weights), the speed-up transform as the compile mode allows, then the engine's LLM node around it
(mstar.llm.build), whose warmup compiles the transformed model before its decode graphs are captured.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from mstar.graph import BuildContext, Node
from mstar.llm.build import LLMGeometry, build_llm_node, use_one_cpu_thread
from mstar.models.checkpoint import build_module, default_dtype
from mstar.models.qwen3.config import Qwen3Config
from mstar.models.qwen3.transformer import Qwen3ForCausalLM

log = logging.getLogger("mstar.models.qwen3")


def geometry_of(config: Qwen3Config) -> LLMGeometry:
    return LLMGeometry(
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.vocab_size,
    )


def load_qwen3(
    config: Qwen3Config,
    device: str | torch.device,
    dtype: torch.dtype,
    folder=None,
    progress=None,
    seed: int = 0,
) -> Qwen3ForCausalLM:
    """From a transformers folder's safetensors (tensor names as Qwen3ForCausalLM's), or seeded
    random weights of the same shapes when `folder` is None."""
    return build_module(
        lambda: Qwen3ForCausalLM(config), device, dtype, folder=folder, seed=seed, progress=progress
    )


def serving_model(model: Qwen3ForCausalLM, compile_mode: str, device: str) -> tuple[torch.nn.Module, Any]:
    """The model as the server runs it, and its CompiledParts (None when eager): the eager
    reference under compile_mode "off" (and on the CPU, where compiling does not pay), else the
    fused model (mstar.models.qwen3.optimize) with its functions compiled at the node's warmup."""
    from mstar.engine.compile import effective_mode
    from mstar.models.qwen3.optimize import compile_fused, optimize

    mode = effective_mode(compile_mode, str(device))
    if mode == "off":
        return model, None
    started = time.monotonic()
    num_layers = len(model.model.layers)
    fused = optimize(model)
    compiled = compile_fused(fused, mode)
    log.info(
        "qwen3: q/k/v and gate/up projections of %d layers fused in %.1f s; compile_mode %s, compiled at warmup",
        num_layers, time.monotonic() - started, mode,
    )  # fmt: skip
    return fused, compiled


def build_qwen3_llm_node(
    ctx: BuildContext,
    config: Qwen3Config,
    model: Qwen3ForCausalLM,
    tokenizer: Any,
    eos_ids: tuple[int, ...],
    context_length: int,
    dtype: torch.dtype,
) -> Node:
    """The served node over a loaded eager model (the server's build and the step profile alike)."""
    served, compiled = serving_model(model, ctx.config.compile_mode, ctx.device)
    return build_llm_node(
        ctx, served, geometry_of(config), tokenizer, eos_ids, context_length, dtype, compiled=compiled
    )


def build_qwen3_nodes(spec, ctx: BuildContext) -> dict[str, Node]:
    config = spec.model_config(ctx.config)
    device = torch.device(ctx.device)
    use_one_cpu_thread(device)
    dtype = default_dtype(device, ctx.config.dtype)
    folder = None if ctx.random_weights else spec.folder(ctx.config)
    model = load_qwen3(config, device, dtype, folder, ctx.progress)
    tokenizer = spec.load_tokenizer(ctx.config)
    eos_ids = tuple(dict.fromkeys([*tokenizer.eos_token_ids, *config.eos_ids]))
    node = build_qwen3_llm_node(
        ctx, config, model, tokenizer, eos_ids, spec.context_length(ctx.config), dtype
    )
    return {"llm": node}
