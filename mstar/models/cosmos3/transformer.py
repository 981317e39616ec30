"""Cosmos3 transformer (diffusers Cosmos3OmniTransformer's state-dict keys), its two pathways apart.

    prefix = model.understand(input_ids, attention)      # once per (request, label): [layers, 2, L, Hkv, D]
    velocities = model.generate(                         # every step, many requests packed
        [VisionInput(latents, timestep, fps, clean_frames), ...],
        StackedPrefixKV([prefix_of_item_0, prefix_of_item_1, ...]),
        PrefixAttention(attention),
    )

The understanding pathway (causal over the prompt's tokens) never reads a vision token, so its
keys and values are the same at every step: diffusers recomputes them for each step and label,
here they are computed once and handed to the generation pathway, whose vision queries attend to
their item's prefix plus the item's own vision tokens. Items differ in size, frame count, timestep,
prefix and label; patchify, rotary tables and timestep rows are per item, the layer stack runs once
over the packed vision tokens (dense attention planned once per call, run in every layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from mstar.diffusion.packing import bounded_cache_get
from mstar.engine.attention import AttentionLayout, PrefixKV, PrefixLayout
from mstar.engine.transfer import to_device
from mstar.models.cosmos3.config import Cosmos3TransformerConfig
from mstar.models.cosmos3.geometry import TIMESTEP_CHANNELS, patch_grid, vision_temporal_offset
from mstar.models.cosmos3.layers import GENERATION_LABEL, UNDERSTANDING_LABEL, Cosmos3Layer, make_norm
from mstar.models.cosmos3.rope import MultimodalRotary, text_positions, vision_positions
from mstar.models.wan22.dit_layers import TimestepEmbedding, sinusoidal_embedding

MAX_CACHED_TABLES = 64


@dataclass
class VisionInput:
    """One (request, label) of a generation forward. latents [C, F, H, W]: the current sample in
    diffusion space; timestep on the sampler's 0..1000 scale; clean_frames: latent frames kept as
    conditioning (image-to-video's first), which get no timestep embedding and no prediction."""

    latents: torch.Tensor
    timestep: float
    fps: float = 24.0
    clean_frames: tuple[int, ...] = ()


@dataclass
class PackedVision:
    """One generation forward's packed inputs (built per call; lengths on the host)."""

    tokens: torch.Tensor  # [T, hidden]: patches through proj_in, plus timestep rows on noisy tokens
    rotary: tuple[torch.Tensor, torch.Tensor]  # cos/sin [T, 1, head_dim], model dtype
    noisy_rows: torch.Tensor  # int64 [Tn]: the tokens whose prediction is read
    grids: list[tuple[int, int, int]]  # per item (frames, height, width) in patches
    token_counts: tuple[int, ...]
    noisy_frames: list[list[int]]


class Cosmos3Transformer(nn.Module):
    # Kept in float32 when the model runs in bf16 (diffusers' _keep_in_fp32_modules).
    fp32_param_patterns = ("time_embedder",)
    compiled_methods = ("run_generation_layers",)  # the layer stack, pack length dynamic
    # Checkpoint tensors we do not build: the reasoner's LM head and final norm, the sound and
    # action heads (modes refused). "norm.weight" matches only the top-level norm: every layer's
    # norm weights are ours, and only tensors we lack are checked against these.
    unused_checkpoint_patterns = ("lm_head.", "audio_", "action_", "norm.weight")

    def __init__(self, config: Cosmos3TransformerConfig, temporal_compression: int = 4):
        super().__init__()
        self.config = config
        self.temporal_compression = temporal_compression  # the VAE's, for fps-scaled positions
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.layers = nn.ModuleList(Cosmos3Layer(config) for _ in range(config.num_hidden_layers))
        self.norm_moe_gen = make_norm(config, hidden)
        self.proj_in = nn.Linear(config.patch_latent_dim, hidden)
        self.proj_out = nn.Linear(hidden, config.patch_latent_dim)
        self.time_embedder = TimestepEmbedding(TIMESTEP_CHANNELS, hidden)
        self.rotary = MultimodalRotary(config)
        self.num_understanding_forwards = 0  # counts understand() calls (tests, metrics)
        self._rotary_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """diffusers' full state dict: tensors of the parts we do not build are skipped (only keys
        we lack, so a missing or misnamed tensor of ours still fails a strict load)."""
        own = set(self.state_dict().keys())
        patterns = self.unused_checkpoint_patterns
        kept = {k: v for k, v in state_dict.items() if k in own or not k.startswith(patterns)}
        return super().load_state_dict(kept, strict=strict, assign=assign)

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_out.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj_out.weight.device

    # ---- the understanding pathway: once per prompt ----

    def understand(self, input_ids: Sequence[int] | torch.Tensor, attention) -> torch.Tensor:
        """One prompt's token ids [L] -> the keys and values every generation layer attends to,
        [num_layers, 2, L, Hkv, D] (index 0 keys, 1 values) in the model dtype. `attention` is a
        RaggedAttention; one prompt per call, so a prompt's K/V never depend on other prompts."""
        ids = torch.as_tensor(input_ids, dtype=torch.int64).flatten()
        if ids.numel() == 0:
            raise ValueError("Cosmos3 understand: the prompt has no tokens")
        num_tokens = int(ids.numel())
        hidden = self.embed_tokens(to_device(ids, self.device))  # [L, hidden]
        cos, sin = self.rotary.tables(text_positions(num_tokens), self.device, self.dtype)
        attention.plan(UNDERSTANDING_LABEL, AttentionLayout.self_attention((num_tokens,), causal=True))
        config = self.config
        kv = hidden.new_empty(len(self.layers), 2, num_tokens, config.num_key_value_heads, config.head_dim)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            hidden, kv[index, 0], kv[index, 1] = layer.understand(hidden, cos, sin, attention, index == last)
        self.num_understanding_forwards += 1
        return kv

    # ---- the generation pathway: every step, items packed ----

    def generate(self, items: list[VisionInput], prefix: PrefixKV, attention) -> list[torch.Tensor]:
        """One velocity [C, F, H, W] (model dtype) per item; item i attends to prefix segment i.
        `attention` is a PrefixAttention; zeros at clean frames, as diffusers returns them."""
        prefix_lens = tuple(prefix.prefix_lens)
        if len(prefix_lens) != len(items):
            raise ValueError(f"Cosmos3 generate: {len(items)} items but {len(prefix_lens)} prefixes")
        step = self.pack(items, prefix_lens)
        attention.plan(GENERATION_LABEL, PrefixLayout(prefix_lens, step.token_counts), prefix)
        try:
            patches = self.run_generation_layers(step.tokens, step.rotary, step.noisy_rows, attention)
        finally:
            attention.release(GENERATION_LABEL)
        return self.unpack(patches, step, items)

    def run_generation_layers(
        self, tokens: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], noisy_rows, attention
    ) -> torch.Tensor:
        """The layer stack and output head: [T, hidden] -> predictions of the noisy tokens
        [Tn, patch_latent_dim] (the part worth compiling, T dynamic)."""
        cos, sin = rotary
        for index, layer in enumerate(self.layers):
            tokens = layer.generate(tokens, cos, sin, attention, index)
        # the norm is per token, so reading the noisy rows first changes nothing
        return self.proj_out(self.norm_moe_gen(tokens.index_select(0, noisy_rows)))

    def pack(self, items: list[VisionInput], prefix_lens: tuple[int, ...]) -> PackedVision:
        if not items:
            raise ValueError("Cosmos3 generate needs at least one item")
        patches, cos_parts, sin_parts, grids, noisy_frames = [], [], [], [], []
        row_index, noisy_rows = [], []
        start = 0
        for row, (item, prefix_len) in enumerate(zip(items, prefix_lens, strict=True)):
            item_patches, grid = self._patchify(item.latents)
            patches.append(item_patches)
            grids.append(grid)
            offset = vision_temporal_offset(prefix_len, self.config)
            cos, sin = self._vision_rotary(grid, offset, float(item.fps))
            cos_parts.append(cos)
            sin_parts.append(sin)
            clean = {frame for frame in item.clean_frames if 0 <= frame < grid[0]}
            frames = [frame for frame in range(grid[0]) if frame not in clean]
            noisy_frames.append(frames)
            per_frame = grid[1] * grid[2]
            # clean tokens read row len(items), a zero row: no timestep embedding, as diffusers
            rows = torch.full((grid[0], per_frame), len(items), dtype=torch.int64)
            rows[frames] = row
            row_index.append(rows.flatten())
            for frame in frames:
                noisy_rows.append(torch.arange(start + frame * per_frame, start + (frame + 1) * per_frame))
            start += grid[0] * per_frame
        tokens = self.proj_in(torch.cat(patches))
        time_rows = self._time_rows([item.timestep for item in items])  # [len(items) + 1, hidden]
        tokens = tokens + time_rows[to_device(torch.cat(row_index), self.device)]
        return PackedVision(
            tokens=tokens,
            rotary=(torch.cat(cos_parts), torch.cat(sin_parts)),
            noisy_rows=to_device(torch.cat(noisy_rows), self.device),
            grids=grids,
            token_counts=tuple(p.shape[0] for p in patches),
            noisy_frames=noisy_frames,
        )

    def unpack(
        self, patches: torch.Tensor, step: PackedVision, items: list[VisionInput]
    ) -> list[torch.Tensor]:
        """Noisy-token predictions [Tn, p*p*C] -> one [C, F, H, W] per item (zeros at clean frames)."""
        p, channels = self.config.latent_patch_size, self.config.latent_channel
        counts = [
            len(frames) * grid[1] * grid[2]
            for frames, grid in zip(step.noisy_frames, step.grids, strict=True)
        ]
        outputs = []
        for item_patches, frames, grid, item in zip(
            torch.split(patches, counts), step.noisy_frames, step.grids, items, strict=True
        ):
            _, num_frames, height, width = item.latents.shape
            output = patches.new_zeros(channels, num_frames, height, width)
            if frames:
                x = item_patches.reshape(len(frames), grid[1], grid[2], p, p, channels)
                x = x.permute(5, 0, 1, 3, 2, 4).reshape(channels, len(frames), grid[1] * p, grid[2] * p)
                output[:, frames] = x[:, :, :height, :width]
            outputs.append(output)
        return outputs

    def _patchify(self, latents: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[C, F, H, W] -> tokens [F*h*w, p*p*C] (features in (p, q, C) order) and the grid (F, h, w);
        odd sides are zero-padded to the patch, as diffusers does."""
        config = self.config
        if latents.dim() != 4 or latents.shape[0] != config.latent_channel:
            raise ValueError(
                f"latents must be [{config.latent_channel}, F, H, W], got {tuple(latents.shape)}"
            )
        latents = latents.to(self.device, self.dtype)
        p = config.latent_patch_size
        grid = patch_grid(tuple(latents.shape), p)
        frames, height, width = grid
        if (height * p, width * p) != tuple(latents.shape[2:]):
            padded = latents.new_zeros(latents.shape[0], frames, height * p, width * p)
            padded[:, :, : latents.shape[2], : latents.shape[3]] = latents
            latents = padded
        x = latents.reshape(latents.shape[0], frames, height, p, width, p)
        return x.permute(1, 2, 4, 3, 5, 0).reshape(frames * height * width, -1), grid

    def _vision_rotary(self, grid, offset: int, fps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of one item's vision tokens, cached on the device (sizes repeat every step)."""

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            positions = vision_positions(grid, offset, fps, self.config, self.temporal_compression)
            return self.rotary.tables(positions, self.device, self.dtype)

        key = (grid, offset, fps, str(self.device), self.dtype)
        return bounded_cache_get(self._rotary_cache, key, build, MAX_CACHED_TABLES)

    def _time_rows(self, timesteps: list[float]) -> torch.Tensor:
        """One timestep embedding row per item, then a zero row: [len + 1, hidden] (model dtype).

        One row at a time: BLAS picks its kernel by row count, so embedding the rows together
        would make an item's output depend on its company."""
        scaled = torch.tensor(timesteps, dtype=torch.float32) * self.config.timestep_scale
        embedder_dtype = self.time_embedder.linear_1.weight.dtype
        sinusoid = sinusoidal_embedding(to_device(scaled, self.device), TIMESTEP_CHANNELS).to(embedder_dtype)
        rows = [self.time_embedder(row) for row in sinusoid.split(1)]
        rows.append(torch.zeros_like(rows[0]))
        return torch.cat(rows).to(self.dtype)
