"""Wan DiT (diffusers WanTransformer3DModel, same state-dict keys) over a packed list of items.

    dit = WanDiT(WanDiTConfig(...))                     # load weights with mstar.models.checkpoint
    dit = optimize(dit, fuse=True, kernels=True)        # mstar.models.wan22.optimize (optional)
    attn = build_attention("auto", device, dtype)
    velocities = dit([DiTInput(latents, timestep, text), ...], attn)   # one [C, F, H, W] per item
    text_kv = dit.text_kv(text)                         # once per text: reuse it at every step
    velocities = dit([DiTInput(latents, timestep, text_kv=text_kv), ...], attn)

Each item has its own size, timestep and text (the guidance pair is two items; a cross-request step
is all items of all requests). Patchify and rotary tables are per item; the layer stack runs once
over the packed tokens with `attn.plan("self")` / `attn.plan("cross")` once per call.
Cross attention's keys and values depend only on the text, which is the same at every step of a
request: `text_kv` computes them for one text (per layer: text embedder, to_k/to_v, norm_k) and an
item carries them; an item without them gets them computed in `pack`, alone (never batched with
other items' text, so an item's output does not depend on its company).
For image-to-video, `num_clean_frames` leading latent frames get timestep 0 (diffusers'
expand_timesteps with the first-frame mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mstar.diffusion.packing import MIN_COMPILED_ROWS, bounded_cache_get
from mstar.engine.attention import AttentionLayout
from mstar.engine.transfer import to_device
from mstar.models.wan22.config import WanDiTConfig
from mstar.models.wan22.dit_layers import ConditionEmbedder, WanBlock, WanBlocks, grid_rotary, rotary_tables

MAX_CACHED_GRIDS = 64


@dataclass
class DiTInput:
    """One item of a packed forward: latents [C, F, H, W], its timestep (0..1000 scale) and its text,
    as embeddings [L, text_dim] or as `WanDiT.text_kv(text)` [num_layers, 2, L, dim] (then `text` is
    not read and may be None)."""

    latents: torch.Tensor
    timestep: float
    text: torch.Tensor | None = None
    num_clean_frames: int = 0
    text_kv: torch.Tensor | None = None


@dataclass
class PackedStep:
    """Everything the layer stack needs for one packed forward (built per call, host-side lengths)."""

    tokens: torch.Tensor  # [T, dim]
    text_kv: torch.Tensor  # [num_layers, 2, Tkv, dim]: per layer, normalised keys and values
    temb_rows: torch.Tensor  # [R, dim]
    modulation_rows: torch.Tensor  # [R, 6, dim]
    row_index: torch.Tensor  # [T] int64: token -> row
    rotary: tuple[torch.Tensor, torch.Tensor]  # cos/sin float32 [T, 1, D/2]
    grids: list[tuple[int, int, int]]  # per item (frames, height, width) in patches
    token_counts: tuple[int, ...]
    text_counts: tuple[int, ...]


class WanDiT(nn.Module):
    # Kept in float32 when the model runs in bf16 (diffusers' _keep_in_fp32_modules).
    fp32_param_patterns = ("time_embedder", "scale_shift_table", "norm2")
    # What the scaffold compiles (mstar.engine.compile.compile_methods), once with the pack length
    # dynamic: one graph serves every item count, since the timestep rows are never one
    # (_timestep_rows), and no duck shapes (their count would otherwise share a symbol with the
    # keys/values' 2). That saves a second compile at boot (186 s on the H200).
    compiled_methods = ("run_layers",)

    def __init__(self, config: WanDiTConfig):
        super().__init__()
        self.config = config
        dim = config.inner_dim
        self.patch_embedding = nn.Conv3d(
            config.in_channels, dim, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.condition_embedder = ConditionEmbedder(dim, config.freq_dim, config.text_dim)
        self.blocks = WanBlocks(
            (
                WanBlock(dim, config.ffn_dim, config.num_attention_heads, config.cross_attn_norm, config.eps)
                for _ in range(config.num_layers)
            ),
            config.eps,
        )
        self.proj_out = nn.Linear(
            dim, config.out_channels * config.patch_size[0] * config.patch_size[1] * config.patch_size[2]
        )
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self._rotary_tables = rotary_tables(config.attention_head_dim, config.rope_max_seq_len)
        self._rotary_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_out.weight.dtype

    def num_tokens(self, latent_shape: tuple[int, ...]) -> int:
        """Tokens of one item with latents [C, F, H, W]."""
        p_t, p_h, p_w = self.config.patch_size
        return (latent_shape[1] // p_t) * (latent_shape[2] // p_h) * (latent_shape[3] // p_w)

    def forward(self, items: list[DiTInput], attention) -> list[torch.Tensor]:
        """One velocity [C, F, H, W] (model dtype) per item."""
        step = self.pack(items)
        attention.plan("self", AttentionLayout.self_attention(step.token_counts))
        attention.plan("cross", AttentionLayout.cross_attention(step.token_counts, step.text_counts))
        patches = self.run_layers(
            step.tokens,
            step.text_kv,
            step.modulation_rows,
            step.temb_rows,
            step.row_index,
            step.rotary,
            attention,
        )
        return self.unpack(patches, step)

    def run_layers(
        self, tokens, text_kv, modulation_rows, temb_rows, row_index, rotary, attention
    ) -> torch.Tensor:
        """The layer stack and output head over packed tokens [T, dim] -> [T, p_t*p_h*p_w*C]
        (the part worth compiling, T and Tkv dynamic: the head's norm and modulation fuse there too).
        text_kv [num_layers, 2, Tkv, dim]: each block reads its layer's slice."""
        head_rows = (self.scale_shift_table + temb_rows.unsqueeze(1)).unbind(1)  # shift, scale [R, dim]
        return self.proj_out(
            self.blocks(tokens, text_kv, modulation_rows, head_rows, row_index, rotary, attention)
        )

    def text_kv(self, text: torch.Tensor) -> torch.Tensor:
        """One item's text [L, text_dim] -> cross-attention keys and values of every layer
        [num_layers, 2, L, dim] (index 0: RMS-normed keys, 1: values) in the model dtype.

        One text per call: BLAS picks its kernel by row count, so batching several items' text
        would make an item's keys depend on its company (see ConditionEmbedder.time_rows)."""
        device, dtype = self.proj_out.weight.device, self.dtype
        context = self.condition_embedder.text_embedder(text.to(device, dtype))  # [L, dim]
        # Written in place: one buffer instead of per-layer tensors plus a stacked copy.
        text_kv = context.new_empty(len(self.blocks), 2, *context.shape)
        for index, block in enumerate(self.blocks):
            text_kv[index, 0], text_kv[index, 1] = block.attn2.context_key_value(context)
        return text_kv

    def pack(self, items: list[DiTInput]) -> PackedStep:
        if not items:
            raise ValueError("WanDiT needs at least one item")
        device, dtype = self.proj_out.weight.device, self.dtype
        patches, grids, rotary_cos, rotary_sin = [], [], [], []
        for item in items:
            if item.latents.dim() != 4 or item.latents.shape[0] != self.config.in_channels:
                raise ValueError(
                    f"latents must be [{self.config.in_channels}, F, H, W], got {tuple(item.latents.shape)}"
                )
            # [C, F, H, W] -> [dim, F', H', W'] -> [F'*H'*W', dim]
            embedded = self.patch_embedding(item.latents.to(device, dtype).unsqueeze(0))[0]
            grids.append(tuple(embedded.shape[1:]))
            patches.append(embedded.flatten(1).transpose(0, 1))
            cos, sin = self._grid_rotary(grids[-1], device)
            rotary_cos.append(cos)
            rotary_sin.append(sin)
        token_counts = tuple(p.shape[0] for p in patches)
        timesteps, row_index = self._timestep_rows(items, grids, token_counts)
        # no host sync: a blocking copy here would wait for the previous step's kernels
        temb_rows, modulation_rows = self.condition_embedder.time_rows(to_device(timesteps, device), dtype)
        text_kvs = [self._item_text_kv(item, device, dtype) for item in items]
        return PackedStep(
            tokens=torch.cat(patches).contiguous(),
            # contiguous either way (one item: a no-op), so the compiled stack sees one layout
            text_kv=text_kvs[0].contiguous() if len(text_kvs) == 1 else torch.cat(text_kvs, dim=2),
            temb_rows=temb_rows,
            modulation_rows=modulation_rows,
            row_index=to_device(row_index, device),
            rotary=(torch.cat(rotary_cos), torch.cat(rotary_sin)),
            grids=grids,
            token_counts=token_counts,
            text_counts=tuple(kv.shape[2] for kv in text_kvs),
        )

    def _item_text_kv(self, item: DiTInput, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The item's text_kv [num_layers, 2, L, dim], computed now when it carries none."""
        if item.text_kv is None:
            if item.text is None:
                raise ValueError("a DiTInput needs text or text_kv")
            return self.text_kv(item.text)
        expected = (len(self.blocks), 2, self.config.inner_dim)
        shape = tuple(item.text_kv.shape)
        if len(shape) != 4 or (shape[0], shape[1], shape[3]) != expected:
            raise ValueError(f"text_kv must be [{expected[0]}, 2, L, {expected[2]}], got {shape}")
        return item.text_kv.to(device, dtype)

    def _grid_rotary(
        self, grid: tuple[int, int, int], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary cos/sin of one patch grid, cached on the device (sizes repeat every step)."""

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = grid_rotary(self._rotary_tables, grid)
            return cos.to(device), sin.to(device)

        return bounded_cache_get(self._rotary_cache, (grid, str(device)), build, MAX_CACHED_GRIDS)

    @staticmethod
    def _timestep_rows(items, grids, token_counts) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct timesteps (one row per item, plus a 0 row for clean frames) and token -> row [T].

        At least MIN_COMPILED_ROWS rows (see mstar.diffusion.packing). Padding here, before the
        rows are embedded, costs nothing: time_rows computes one row at a time, so a padding row
        changes no other."""
        timesteps: list[float] = []
        indices = []
        for item, grid, count in zip(items, grids, token_counts, strict=True):
            row = len(timesteps)
            timesteps.append(float(item.timestep))
            index = torch.full((count,), row, dtype=torch.int64)
            if item.num_clean_frames > 0:
                timesteps.append(0.0)
                index[: item.num_clean_frames * grid[1] * grid[2]] = row + 1
            indices.append(index)
        timesteps += [0.0] * (MIN_COMPILED_ROWS - len(timesteps))
        return torch.tensor(timesteps, dtype=torch.float32), torch.cat(indices)

    def unpack(self, patches: torch.Tensor, step: PackedStep) -> list[torch.Tensor]:
        """Output head's patches [T, p_t*p_h*p_w*C] -> one [C, F, H, W] per item."""
        outputs = []
        for tokens, grid in zip(torch.split(patches, list(step.token_counts)), step.grids, strict=True):
            outputs.append(self._unpatchify(tokens, grid))
        return outputs

    def _unpatchify(self, tokens: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        """[F'*H'*W', p_t*p_h*p_w*C] -> [C, F'*p_t, H'*p_h, W'*p_w]."""
        frames, height, width = grid
        p_t, p_h, p_w = self.config.patch_size
        x = tokens.reshape(frames, height, width, p_t, p_h, p_w, -1)
        x = x.permute(6, 0, 3, 1, 4, 2, 5)
        return x.reshape(x.shape[0], frames * p_t, height * p_h, width * p_w)
