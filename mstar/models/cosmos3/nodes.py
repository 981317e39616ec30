"""Building Cosmos3's nodes inside a worker, from a diffusers Cosmos3OmniPipeline folder or seeded
random weights: vae_encoder (image-to-video), dit (the understanding prefill into the KV pool and
the packed denoise loop) and vae_decoder, each the shared node over a Cosmos3Pipeline."""

from __future__ import annotations

from pathlib import Path

from mstar.graph import BuildContext, Node
from mstar.models.checkpoint import build_module, default_dtype
from mstar.models.cosmos3.config import Cosmos3Config
from mstar.models.cosmos3.pipeline import NAMESPACE, Cosmos3Pipeline
from mstar.models.scaffold import build_dit_node, build_named_nodes, checkpoint_folder, warmup_sizes

MAX_PROMPT_TOKENS = 2048  # per label; a longer prompt fails its request with a clear error
# The pool holds prefixes of running requests and the prefix cache; it is sized from the memory
# left after the weights, at most this much (the rest is the generation pathway's activations).
MAX_POOL_BYTES_CUDA = 4 * 1024**3
MAX_POOL_BYTES_CPU = 256 * 1024**2
CACHED_PREFIXES_PER_RUNNING = 4  # prefix-cache room beyond the running requests' own prefixes


def load_config(model_path: str | None, default: Cosmos3Config) -> Cosmos3Config:
    """The folder's transformer, scheduler, VAE and pipeline flags; the spec's request recipe."""
    if model_path is None:
        return default
    return Cosmos3Config.from_folder(model_path, recipe=default.recipe)


def build_nodes(default_config: Cosmos3Config, ctx: BuildContext, model_name: str) -> dict[str, Node]:
    model_path = checkpoint_folder(ctx, model_name)
    config = load_config(model_path, default_config)
    dtype = default_dtype(ctx.device, ctx.config.dtype)
    builders = {
        "dit": lambda: _dit_node(config, ctx, model_path, dtype),
        "vae_encoder": lambda: _vae_encoder_node(config, ctx, model_path, dtype),
        "vae_decoder": lambda: _vae_decoder_node(config, ctx, model_path, dtype),
    }
    return build_named_nodes(ctx, model_name, builders)


def _tokenizer(model_path: str | None):
    from mstar.models.cosmos3.text import load_tokenizer, offline_tokenizer

    if model_path is not None and (Path(model_path) / "text_tokenizer").is_dir():
        return load_tokenizer(model_path)
    return offline_tokenizer()


def build_prefix_pool(config: Cosmos3Config, ctx: BuildContext, dtype):
    """The paged KV pool of understanding prefixes (after the weights, before warmup)."""
    from mstar.engine.kv.pool import KVGeometry, build_kv_pool

    t, server = config.transformer, ctx.config
    geometry = KVGeometry(
        t.num_hidden_layers, t.num_key_value_heads, t.head_dim, dtype, server.kv_page_tokens
    )
    prompt_pages = -(-MAX_PROMPT_TOKENS // geometry.page_tokens)
    running = server.max_batch_size * 2  # every running request with both labels
    cuda = str(ctx.device).startswith("cuda")
    return build_kv_pool(
        geometry, ctx.device, num_pages=server.kv_pool_pages,
        memory_fraction=server.kv_cache_memory_fraction,
        max_useful_pages=running * CACHED_PREFIXES_PER_RUNNING * prompt_pages,
        min_pages=2 * prompt_pages, enable_prefix_cache=server.enable_prefix_caching,
        memory_cap_bytes=MAX_POOL_BYTES_CUDA if cuda else MAX_POOL_BYTES_CPU,
    )  # fmt: skip


def _dit_node(config: Cosmos3Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.engine.attention import PrefixAttention
    from mstar.engine.kv.prefix import PrefixPages
    from mstar.models.cosmos3.weights import load_transformer

    def load():
        return load_transformer(model_path, ctx.device, dtype, config=config, progress=ctx.progress)

    def pipeline(dit, attention) -> Cosmos3Pipeline:
        prefixes = PrefixPages(build_prefix_pool(config, ctx, dtype), NAMESPACE)
        return Cosmos3Pipeline(
            config, ctx.device, dtype, dit=dit, tokenizer=_tokenizer(model_path), ragged=attention,
            dense=PrefixAttention(attention), prefixes=prefixes, max_prompt_tokens=MAX_PROMPT_TOKENS,
        )  # fmt: skip

    # A CPU-sized model gains nothing from a compile at boot.
    tiny = config.transformer.hidden_size < 256
    return build_dit_node(ctx, dtype, "cosmos3.dit", load=load, pipeline=pipeline, compile=not tiny)


def _vae(config: Cosmos3Config, ctx: BuildContext, model_path: str | None, dtype, part: str):
    from mstar.models.cosmos3.weights import load_vae
    from mstar.models.wan22.vae import WanVAEDecoder, WanVAEEncoder

    if model_path is not None:
        return load_vae(model_path, ctx.device, dtype, part=part, progress=ctx.progress)
    module = WanVAEEncoder if part == "encoder" else WanVAEDecoder
    return build_module(lambda: module(config.vae), ctx.device, dtype, progress=ctx.progress)


def _vae_encoder_node(config: Cosmos3Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_nodes import ImageEncodeNode

    encoder = _vae(config, ctx, model_path, dtype, "encoder")
    return ImageEncodeNode(Cosmos3Pipeline(config, ctx.device, dtype, vae_encoder=encoder))


def _vae_decoder_node(config: Cosmos3Config, ctx: BuildContext, model_path: str | None, dtype) -> Node:
    from mstar.diffusion.vae_decode import VaeDecodeRunner
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.engine.compile import effective_mode

    mode = effective_mode(ctx.config.compile_mode, ctx.device)
    decoder = VaeDecodeRunner(_vae(config, ctx, model_path, dtype, "decoder"), compile_mode=mode)
    pipeline = Cosmos3Pipeline(config, ctx.device, dtype, decoder=decoder)
    return DecodeNode(pipeline, warmup_sizes=warmup_sizes(ctx.config, mode))
