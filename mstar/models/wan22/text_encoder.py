"""Wan's prompt encoder: the UMT5 encoder (transformers) -> one embedding per prompt, as WanPipeline.

Each embedding is [num_tokens, d_model], the real tokens only; the pipeline pads them with zeros to
max_text_tokens for the DiT, which is what diffusers feeds the transformer (it attends to the
padding too).
"""

from __future__ import annotations

import html
import re
from typing import Any

import torch

from mstar.engine.cuda_graphs import GraphedByLength
from mstar.engine.transfer import to_device
from mstar.models.checkpoint import build_module


def clean_prompt(text: str) -> str:
    """diffusers' prompt_clean without ftfy: unescape HTML twice, collapse whitespace."""
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


def build_umt5(
    config: dict[str, Any],
    device: str,
    dtype: torch.dtype,
    folder: str | None = None,
    seed: int = 0,
    progress: Any = None,
):
    """UMT5EncoderModel from a diffusers text_encoder/ folder, or seeded random weights from `config`."""
    from transformers import UMT5Config, UMT5EncoderModel

    known = set(UMT5Config().to_dict())
    umt5_config = UMT5Config(**{k: v for k, v in config.items() if k in known})
    return build_module(
        lambda: UMT5EncoderModel(umt5_config), device, dtype, folder=folder, seed=seed, progress=progress
    )


class UMT5PromptEncoder:
    """Prompts -> UMT5 embeddings, as WanPipeline computes them: every prompt padded to
    `max_text_tokens` (the pipeline's max_sequence_length, 512) with the padding masked out as keys.
    In exact arithmetic the real tokens' states do not depend on the padding; in bf16 they do,
    through the GEMM kernels each sequence length gets. On the H200 at full size a prompt padded to
    a 32-token bucket was 2.2e-2 (relative) from the pipeline's embedding and one padded to 512 was
    its bytes, at 30.3 ms a prompt on the GPU against 7.6 (a cached prompt costs nothing).

    The 256k-row token embedding (2.1 GB for UMT5-XXL) stays in host memory: a prompt gathers at
    most 512 of its rows there, and only those travel. With `offload`, the blocks' weights live in
    host memory too and stream to the device for each forward (mstar.engine.offload). With
    `cuda_graphs` (CUDA, not offloaded), the encoder replays one CUDA graph, captured at warmup."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device,
        max_text_tokens: int = 512,
        cuda_graphs: bool = False,
        offload: bool = False,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_text_tokens = max_text_tokens
        # One host copy of the table: loaded weights may tie it to embed_tokens through two
        # parameters, so the encoder is pointed at the moved module.
        self.model.shared.to("cpu")
        self.model.encoder.embed_tokens = self.model.shared
        self.streamed = None
        if offload:
            from mstar.engine.offload import StreamedBlocks

            self.streamed = StreamedBlocks(self.model.encoder.block, self.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the moved weights' device blocks go back to the driver
        self.use_graphs = cuda_graphs and not offload and self.device.type == "cuda"
        self.hidden = GraphedByLength(
            self._last_hidden, 0, self.device, (max_text_tokens,),
            row_shape=(model.config.d_model,), dtype=next(model.encoder.block.parameters()).dtype,
            key_mask=True,
        )  # fmt: skip

    def warmup(self) -> None:
        """Capture the CUDA graph, when graphs are on."""
        if self.use_graphs:
            self.hidden.capture()

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> list[torch.Tensor]:
        """One [num_tokens_i, d_model] embedding per prompt.

        One prompt per forward: a prompt's embedding never depends on the prompts batched with it,
        and nothing reads the device back (the mask is built here, not by transformers, whose
        check of a mask for padding reads it on the device and waits for the DiT step queued
        before it; the encoder is launch-bound, so batching prompts saved little)."""
        return [self._encode_one(prompt) for prompt in prompts]

    def tokenize(self, prompt: str) -> torch.Tensor:
        """input_ids [1, num_tokens] on the host: the pipeline's ids without its padding (EOS last)."""
        return self.tokenizer(
            [clean_prompt(prompt)],
            max_length=self.max_text_tokens,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )["input_ids"]

    def _encode_one(self, prompt: str) -> torch.Tensor:
        embeds = to_device(self.model.shared(self.tokenize(prompt)), self.device)  # [1, L, d_model]
        return self.hidden(embeds)[0]  # [num_tokens, d_model]

    def _last_hidden(self, embeds: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """UMT5's last hidden state [1, L, d_model]. `valid` [1, L] bool marks the real tokens; the
        others are masked out as keys (an additive mask: 0 on the real ones leaves their scores as
        they were). The blocks are called directly, as transformers' forward calls them."""
        encoder = self.model.encoder
        mask = torch.zeros(valid.shape, dtype=embeds.dtype, device=embeds.device)
        mask = mask.masked_fill(~valid, torch.finfo(embeds.dtype).min)[:, None, None, :]  # [1, 1, 1, L]
        hidden = embeds
        for block in encoder.block:
            hidden = block(hidden, mask)
            hidden = hidden[0] if isinstance(hidden, tuple) else hidden  # older transformers: a tuple
        return encoder.final_layer_norm(hidden)
