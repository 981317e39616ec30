"""Build Qwen3's llm node: the model straight onto its device (safetensors, or seeded random
weights), then the engine's LLM node around it (mstar.llm.build)."""

from __future__ import annotations

import torch

from mstar.graph import BuildContext, Node
from mstar.llm.build import LLMGeometry, build_llm_node, use_one_cpu_thread
from mstar.models.checkpoint import build_module, default_dtype
from mstar.models.qwen3.config import Qwen3Config
from mstar.models.qwen3.transformer import Qwen3ForCausalLM


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


def build_qwen3_nodes(spec, ctx: BuildContext) -> dict[str, Node]:
    config = spec.model_config(ctx.config)
    device = torch.device(ctx.device)
    use_one_cpu_thread(device)
    dtype = default_dtype(device, ctx.config.dtype)
    folder = None if ctx.random_weights else spec.folder(ctx.config)
    model = load_qwen3(config, device, dtype, folder, ctx.progress)
    tokenizer = spec.load_tokenizer(ctx.config)
    eos_ids = tuple(dict.fromkeys([*tokenizer.eos_token_ids, *config.eos_ids]))
    node = build_llm_node(
        ctx, model, geometry_of(config), tokenizer, eos_ids, spec.context_length(ctx.config), dtype
    )
    return {"llm": node}
