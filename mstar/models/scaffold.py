"""What every diffusion family's folder builds its nodes with, in one order.

    nodes = build_named_nodes(ctx, "wan2.2-ti2v-5b", {"text_encoder": make_text_node, "dit": ...})
    dit_node = build_dit_node(ctx, dtype, "wan.dit", load=load_dit, optimize=optimize, pipeline=make)

`build_dit_node` is the one way a DiT becomes a node: the engine's resources first (the shared
workspace before any weights take memory, then the attention backend, checked with a tiny
plan-and-run: boot fails fast on one that cannot run), then the weights (`load`: the family's eager
model, diffusers' state-dict keys), then the family's speed-ups (`optimize(model, fuse, kernels)`,
CUDA only, as the config allows), then compile (the model's `compiled_methods`, pack length
dynamic), then the pipeline over it and the shared DenoiseNode, whose warmup runs the configured
sizes. Light at import: torch comes with the builders.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mstar.graph import BuildContext, Node

logger = logging.getLogger(__name__)


def checkpoint_folder(ctx: BuildContext, model_name: str) -> str | None:
    """The diffusers folder the nodes load from, or None for seeded random weights."""
    if ctx.model_path is None and not ctx.random_weights:
        raise ValueError(f"{model_name} needs --model-path (a diffusers folder) or --random-weights")
    return None if ctx.random_weights else ctx.model_path


def build_named_nodes(
    ctx: BuildContext, model_name: str, builders: dict[str, Callable[[], Node]]
) -> dict[str, Node]:
    """The nodes of ctx.node_names (this worker's), each from its builder (each module's load
    reports its own progress bar)."""
    nodes: dict[str, Node] = {}
    for name in ctx.node_names:
        if name not in builders:
            raise ValueError(f"{model_name} has no node '{name}'")
        nodes[name] = builders[name]()
    return nodes


def speed_ups(config: Any, device: str) -> tuple[bool, bool]:
    """(fuse projections, hand-written kernels) as the config allows them on `device`: CUDA only,
    kernels only with fused projections and Triton installed."""
    from mstar.engine.kernels import triton_kernels_usable

    fuse = bool(config.fuse_projections) and str(device).startswith("cuda")
    return fuse, fuse and bool(config.triton_kernels) and triton_kernels_usable(device)


def warmup_sizes(config: Any, compile_mode: str) -> list[Any]:
    """The sizes a node warms up at boot: the config's compile sizes (None: the family's default
    size), none when warmup or compiling is off."""
    if not config.warmup or compile_mode == "off":
        return []
    return list(config.compile_sizes) or [None]


def speed_up(
    dit: Any,
    optimize: Callable[..., Any] | None,
    fuse: bool,
    kernels: bool,
    compile_mode: str,
    label: str,
    wrap: Callable[[Any], Any] | None = None,
):
    """optimize -> wrap -> compile, the one order (the server's nodes and the step benchmark alike):
    the family's transform where `fuse` asks for it, `wrap` (the LoRA layers: their adapter slots
    are inputs of the compiled stack), then the model's `compiled_methods`, pack length dynamic.
    Returns (the model, its CompiledParts)."""
    from mstar.engine.compile import compile_methods

    if optimize is not None and fuse:
        dit = optimize(dit, fuse=fuse, kernels=kernels)
        logger.info("%s: fused projections%s", label, ", hand-written kernels" if kernels else "")
    if wrap is not None:
        wrap(dit)
    options = {"persistent_rows": True, "duck_shapes": False}
    return dit, compile_methods(dit, type(dit).compiled_methods, compile_mode, label, **options)


def build_dit_node(
    ctx: BuildContext,
    dtype: Any,
    label: str,
    load: Callable[[], Any],
    pipeline: Callable[[Any, Any], Any],
    optimize: Callable[..., Any] | None = None,
    compile: bool = True,
    max_batch_size: int | None = None,
    lora_targets: Callable[[Any], list[Any]] | None = None,
    lora_keys: Any = None,
):
    """resources (workspace first) -> load -> optimize -> LoRA layers -> compile -> the DenoiseNode
    (warmup at boot).

    `pipeline(dit, attention)` makes the family's pipeline over the built model; `compile=False`
    keeps a model eager everywhere (a tiny one gains nothing from a compile at boot).
    `lora_targets(dit)` (the family's LoraTargets of the model as optimize left it) and `lora_keys`
    (its LoraKeyRules) give the DiT per-request adapters when the server has a lora_dir; the
    pipeline reads them as `pipeline.lora` (None without)."""
    from mstar.diffusion.denoise import DenoiseNode
    from mstar.diffusion.kept import KeptText
    from mstar.engine.compile import effective_mode
    from mstar.engine.resources import build_engine_resources

    server = ctx.config
    attention = build_engine_resources(server, ctx.device, dtype).attention
    fuse, kernels = speed_ups(server, ctx.device)
    mode = effective_mode(server.compile_mode, ctx.device) if compile else "off"
    lora = None

    def wrap(model: Any) -> None:
        nonlocal lora
        if lora_targets is not None and server.lora_dir:
            from mstar.engine.lora.serving import attach_lora

            lora = attach_lora(model, lora_targets, server, lora_keys, on_loaded=ctx.wake)

    dit, compiled = speed_up(load(), optimize, fuse, kernels, mode, label, wrap=wrap)
    family_pipeline = pipeline(dit, attention)
    family_pipeline.lora = lora
    return DenoiseNode(
        family_pipeline,
        compiled=compiled,
        warmup_sizes=warmup_sizes(server, mode),
        max_batch_size=max_batch_size or server.max_batch_size,
        max_step_cost=server.max_tokens_per_step,
        lora=lora,
        kept=KeptText(server.kept_text_mb * 1024 * 1024),
    )
