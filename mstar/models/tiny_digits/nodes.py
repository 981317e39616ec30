"""Building the tiny digits nodes: text_encoder, dit (the shared DenoiseNode over the Wan DiT at a
toy size) and decoder, each the shared node over a DigitsPipeline holding its component. Weights
come from ctx.model_path when given, else the shipped ones (weights/); random with --random-weights.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mstar.graph import BuildContext, Node
from mstar.models.checkpoint import default_dtype
from mstar.models.scaffold import build_dit_node, build_named_nodes
from mstar.models.tiny_digits.config import (
    CONFIG_FILE,
    DIT_FILE,
    TEXT_ENCODER_FILE,
    VOCAB_FILE,
    WEIGHTS_DIR,
    TinyDigitsConfig,
)
from mstar.models.tiny_digits.pipeline import DigitsPipeline
from mstar.models.tiny_digits.text import WordTokenizer, make_text_encoder
from mstar.models.wan22.config import WanDiTConfig
from mstar.models.wan22.dit import WanDiT

MODEL_NAME = "tiny-digits"
MAX_BATCH_SIZE = 64  # a step of 64 requests is 2 * 64 * 16 tokens: nothing for any device


def load_module(
    module: torch.nn.Module,
    path: Path | None,
    device: torch.device,
    dtype: torch.dtype,
    keep_fp32: tuple[str, ...] = (),
) -> torch.nn.Module:
    """Load safetensors straight to the device (a missing or unexpected tensor is an error);
    path None keeps the module's (seeded) random initialisation (--random-weights). Tensors whose
    names contain a `keep_fp32` pattern stay float32, as the checkpoint loader keeps them."""
    from safetensors.torch import load_file

    module.to(device=device, dtype=dtype)
    state = module.state_dict() if path is None else load_file(str(path), device=str(device))
    typed = {name: t.to(_target_dtype(name, dtype, keep_fp32)) for name, t in state.items()}
    module.load_state_dict(typed, strict=True, assign=True)
    return module.eval().requires_grad_(False)


def _target_dtype(name: str, dtype: torch.dtype, keep_fp32: tuple[str, ...]) -> torch.dtype:
    return torch.float32 if any(pattern in name for pattern in keep_fp32) else dtype


def build_nodes(ctx: BuildContext, weights_dir: Path = WEIGHTS_DIR) -> dict[str, Node]:
    """The nodes of ctx.node_names; weights from ctx.model_path when given, else the shipped ones."""
    from mstar.diffusion.vae_nodes import DecodeNode
    from mstar.models.text_encoding import PromptEmbedsNode

    weights_dir = Path(ctx.model_path) if ctx.model_path else weights_dir
    config = TinyDigitsConfig.load(weights_dir / CONFIG_FILE)
    device = torch.device(ctx.device)
    dtype = default_dtype(device, ctx.config.dtype)  # bf16 on GPU (the big models' kernels), fp32 on CPU

    def weights(file_name: str) -> Path | None:
        return None if ctx.random_weights else weights_dir / file_name

    def text_node() -> Node:
        tokenizer = WordTokenizer.load(weights_dir / VOCAB_FILE, config.max_text_tokens)
        encoder = make_text_encoder(len(tokenizer.vocab), config.text_dim)
        load_module(encoder, weights(TEXT_ENCODER_FILE), device, torch.float32)
        pipeline = DigitsPipeline(config, device, text_encoder=encoder, tokenizer=tokenizer)
        return PromptEmbedsNode(
            pipeline, max_batch_size=MAX_BATCH_SIZE, max_cached_bytes=ctx.config.prompt_cache_mb * 1024 * 1024
        )

    def load_dit() -> WanDiT:
        dit = WanDiT(WanDiTConfig.from_dict(config.dit))
        return load_module(dit, weights(DIT_FILE), device, dtype, keep_fp32=WanDiT.fp32_param_patterns)

    def dit_node() -> Node:
        # 16 tokens an image: compiling would cost boot time and gain nothing, so it stays eager.
        return build_dit_node(
            ctx, dtype, "digits.dit", load=load_dit,
            pipeline=lambda dit, attention: DigitsPipeline(config, device, dit=dit, attention=attention),
            compile=False, max_batch_size=MAX_BATCH_SIZE,
        )  # fmt: skip

    def decoder_node() -> Node:
        return DecodeNode(DigitsPipeline(config, device), name="decoder", max_batch_size=MAX_BATCH_SIZE)

    if ctx.random_weights:
        torch.manual_seed(0)  # the same random model in every worker
    builders = {"text_encoder": text_node, "dit": dit_node, "decoder": decoder_node}
    return build_named_nodes(ctx, MODEL_NAME, builders)
