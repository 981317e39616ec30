"""The FLUX.2 transformer (diffusers' Flux2Transformer2DModel, same state-dict keys) over the
tokens of many items packed into one ragged forward.

    dit = build_module(lambda: Flux2DiT(config), device, dtype, folder)   # mstar.models.checkpoint
    attn = build_attention("auto", device, dtype)
    velocities = dit([DiTInput(latents, timestep, text, references), ...], attn)

An item is one (request, label): its output latents [C, h, w] (the patchified grid, C = 128),
its scheduler timestep, its text embeddings [L, joint_attention_dim] and its reference images'
latents (each [C, h_j, w_j]); items differ in all of these. Per item the joint sequence is
[text, output, reference_1, ...] as in the pipeline, and joint attention runs within each item
only: one segment per item, planned once per forward under the label "joint" and run by every
block. Double-stream blocks keep the text and image streams apart (their own weights) and meet
in attention; single-stream blocks run on the joint sequence. Position ids are the pipeline's:
text (0, 0, 0, l), output (0, y, x, 0), reference j (10 + 10 j, y, x, 0), four rotary axes.
The output is the flow velocity of the output tokens only, [C, h, w] per item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from mstar.diffusion.packing import bounded_cache_get
from mstar.engine.attention import AttentionLayout
from mstar.engine.transfer import to_device
from mstar.models.flux2_klein.config import TransformerConfig, from_json_dict
from mstar.models.flux2_klein.dit_layers import (
    DoubleStreamBlock,
    DoubleStreamBlocks,
    Modulation,
    OutputNorm,
    SingleStreamBlock,
    SingleStreamBlocks,
    TimeGuidanceEmbed,
)
from mstar.models.flux2_klein.geometry import REFERENCE_TIME_STEP, StepTokens

JOINT_LABEL = "joint"
MAX_CACHED_LAYOUTS = 64  # token maps per packing (the same packings come back every step)
MAX_CACHED_TABLES = 32  # rotary tables per text length and grid (2 MB each for a 1024x1024 grid)


@dataclass
class DiTInput:
    """One item of a packed forward. latents [C, h, w]: the patchified, batch-normalised latent grid
    (the pipeline's packed [h*w, C] tokens before packing); timestep: the scheduler's timestep
    (0..1000, sampler.timesteps[i]), fed to the model as the pipeline does (t / 1000 in the model
    dtype, then x 1000); text [L, joint_attention_dim]; references: [C, h_j, w_j] each."""

    latents: torch.Tensor
    timestep: float
    text: torch.Tensor
    references: Sequence[torch.Tensor] = field(default_factory=tuple)

    def tokens(self) -> StepTokens:
        grids = [self.latents, *self.references]
        counts = [g.shape[-2] * g.shape[-1] for g in grids]
        return StepTokens(self.text.shape[0], counts[0], tuple(counts[1:]))

    def grids(self) -> tuple[tuple[int, int], ...]:
        """(rows, cols) of the output grid, then of each reference."""
        return tuple((g.shape[-2], g.shape[-1]) for g in (self.latents, *self.references))


@dataclass(frozen=True)
class TokenMaps:
    """Index tensors of one packing (on the device). For a single item every map is None but
    output_rows: its joint order is plain [text, image] and its rows broadcast one row of modulation."""

    joint_order: torch.Tensor | None  # joint row -> row of cat([text stream, image stream])
    stream_order: torch.Tensor | None  # row of cat([text stream, image stream]) -> joint row
    text_item: torch.Tensor | None  # item of each text-stream token
    image_item: torch.Tensor | None  # item of each image-stream token
    joint_item: torch.Tensor | None  # item of each joint token
    output_item: torch.Tensor | None  # item of each output token
    output_rows: torch.Tensor  # joint rows of the output tokens, item after item


def build_token_maps(tokens: list[StepTokens], device: torch.device) -> TokenMaps:
    num_text = sum(t.num_text for t in tokens)
    if len(tokens) == 1:
        rows = torch.arange(num_text, num_text + tokens[0].num_output)
        return TokenMaps(None, None, None, None, None, None, rows.to(device))
    order, output_rows = [], []
    joint_start, text_start, image_start = 0, 0, num_text
    for t in tokens:
        order += [
            torch.arange(text_start, text_start + t.num_text),
            torch.arange(image_start, image_start + t.num_image),
        ]
        output_start = joint_start + t.num_text
        output_rows.append(torch.arange(output_start, output_start + t.num_output))
        joint_start += t.num_tokens
        text_start += t.num_text
        image_start += t.num_image

    def items(counts: list[int]) -> torch.Tensor:
        return torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts)).to(device)

    joint_order = torch.cat(order)
    return TokenMaps(
        joint_order=joint_order.to(device),
        stream_order=torch.argsort(joint_order).to(device),
        text_item=items([t.num_text for t in tokens]),
        image_item=items([t.num_image for t in tokens]),
        joint_item=items([t.num_tokens for t in tokens]),
        output_item=items([t.num_output for t in tokens]),
        output_rows=torch.cat(output_rows).to(device),
    )


@dataclass
class ItemRows:
    """Per-item rows of one forward, each kind side by side in one tensor (chunked after the
    per-token gather): the image and text streams' six modulations [N, 6 * dim] each, the
    single-stream blocks' three [N, 3 * dim], the output norm's (scale, shift) [N, 2 * dim]."""

    image: torch.Tensor
    text: torch.Tensor
    single: torch.Tensor
    output: torch.Tensor


class PackedTokens:
    """One forward's packing: the text stream [sum L_i] and the image stream [sum (N_i + R_i)]
    apart for the double-stream blocks, the joint order [text_i, image_i] item after item (one
    attention segment per item), the rotary tables in joint order and the token maps."""

    def __init__(self, tokens: list[StepTokens], maps: TokenMaps, cos: torch.Tensor, sin: torch.Tensor):
        self.label = JOINT_LABEL
        self.tokens = tokens
        self.maps = maps
        self.cos, self.sin = cos, sin  # [T, head_dim / 2] fp32, joint order
        self.num_text = sum(t.num_text for t in tokens)
        self.layout = AttentionLayout.self_attention([t.num_tokens for t in tokens])

    def joint(self, txt: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        """Text-stream rows and image-stream rows -> the joint order."""
        both = torch.cat([txt, img])
        return both if self.maps.joint_order is None else both[self.maps.joint_order]

    def streams(self, joint: torch.Tensor, num_text: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The joint order -> (text-stream rows, image-stream rows). num_text: the text stream's
        rows, read from a tensor's shape by the caller (a compiled graph keeps it symbolic)."""
        both = joint if self.maps.stream_order is None else joint[self.maps.stream_order]
        return both[:num_text], both[num_text:]


class Flux2DiT(nn.Module):
    compiled_methods = ("run_blocks",)  # both stacks, pack length dynamic (mstar.models.scaffold)

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if sum(config.axes_dims_rope) != config.attention_head_dim:
            raise ValueError(
                f"axes_dims_rope {config.axes_dims_rope} must sum to the head dim {config.attention_head_dim}"
            )
        if config.patch_size != 1:
            raise ValueError(f"patch_size {config.patch_size} is not supported (FLUX.2 checkpoints use 1)")
        self.config = config
        dim, heads, head_dim = config.inner_dim, config.num_attention_heads, config.attention_head_dim
        mlp, eps = config.mlp_hidden_dim, config.eps
        self.time_guidance_embed = TimeGuidanceEmbed(
            config.timestep_guidance_channels, dim, config.guidance_embeds
        )
        self.double_stream_modulation_img = Modulation(dim, 2)
        self.double_stream_modulation_txt = Modulation(dim, 2)
        self.single_stream_modulation = Modulation(dim, 1)
        self.x_embedder = nn.Linear(config.in_channels, dim, bias=False)
        self.context_embedder = nn.Linear(config.joint_attention_dim, dim, bias=False)
        self.transformer_blocks = DoubleStreamBlocks(
            DoubleStreamBlock(dim, heads, head_dim, mlp, eps) for _ in range(config.num_layers)
        )
        self.single_transformer_blocks = SingleStreamBlocks(
            SingleStreamBlock(dim, heads, head_dim, mlp, eps) for _ in range(config.num_single_layers)
        )
        self.norm_out = OutputNorm(dim, eps)
        self.proj_out = nn.Linear(dim, config.num_out_channels, bias=False)
        self._inverse_frequencies = [
            1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
            for d in config.axes_dims_rope
        ]  # built on the CPU: the module may be constructed under a meta device context
        self._cache: dict = {}

    @classmethod
    def from_config(cls, config: TransformerConfig | dict) -> Flux2DiT:
        if isinstance(config, dict):
            config = from_json_dict(TransformerConfig, config)
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.x_embedder.weight.dtype

    # ---- rotary tables -------------------------------------------------------------------------
    def _rotary(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [N, 4] -> (cos, sin) [N, head_dim / 2] fp32, angles in float64 as diffusers'
        Flux2PosEmbed (the pairs' shared value, not repeated)."""
        angles = torch.cat(
            [
                torch.outer(position_ids[:, axis].double(), inv)
                for axis, inv in enumerate(self._inverse_frequencies)
            ],
            dim=-1,
        )
        return angles.cos().float(), angles.sin().float()

    def _table(self, key: tuple, position_ids, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of one part of an item (its text, its output grid, one reference grid) on the
        device, cached by the part's shape: parts repeat across items and steps."""

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = self._rotary(position_ids())
            return cos.to(device), sin.to(device)

        return bounded_cache_get(self._cache, (*key, str(device)), build, MAX_CACHED_TABLES)

    def _packed_rotary(
        self, items: list[DiTInput], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, head_dim / 2] in joint order: per item its text (0, 0, 0, l), its output grid
        (0, y, x, 0), then reference j's grid (10 + 10 j, y, x, 0)."""

        def text_ids(num_text: int) -> torch.Tensor:
            ids = torch.zeros(num_text, 4, dtype=torch.long)
            ids[:, 3] = torch.arange(num_text)
            return ids

        def grid_ids(time: int, rows: int, cols: int) -> torch.Tensor:
            axes = (torch.tensor([time]), torch.arange(rows), torch.arange(cols), torch.tensor([0]))
            return torch.cartesian_prod(*axes)

        tables = []
        for item in items:
            num_text = item.text.shape[0]
            tables.append(self._table(("text", num_text), lambda n=num_text: text_ids(n), device))
            for index, (rows, cols) in enumerate(item.grids()):
                time = REFERENCE_TIME_STEP * index  # 0 for the output, 10, 20, ... for the references
                key = ("grid", time, rows, cols)
                tables.append(self._table(key, lambda t=time, r=rows, c=cols: grid_ids(t, r, c), device))
        return torch.cat([cos for cos, _ in tables]), torch.cat([sin for _, sin in tables])

    # ---- forward -------------------------------------------------------------------------------
    def pack(self, items: list[DiTInput]) -> PackedTokens:
        device = items[0].latents.device
        tokens = [item.tokens() for item in items]
        maps = bounded_cache_get(
            self._cache, ("maps", tuple(tokens), str(device)), lambda: build_token_maps(tokens, device),
            MAX_CACHED_LAYOUTS,
        )  # fmt: skip
        cos, sin = self._packed_rotary(items, device)
        return PackedTokens(tokens, maps, cos, sin)

    def forward(self, items: list[DiTInput], attn) -> list[torch.Tensor]:
        """The velocity of every item's output latents, [C, h, w] each, from one packed pass."""
        dtype = self.dtype
        packed = self.pack(items)
        attn.plan(JOINT_LABEL, packed.layout)
        rows = self._item_rows(items)
        txt = self.context_embedder(torch.cat([item.text.to(dtype) for item in items]))
        img = self.x_embedder(torch.cat([self._image_tokens(item, dtype) for item in items]))
        joint = self.run_blocks(txt, img, rows, packed, attn)
        out = self.norm_out(joint[packed.maps.output_rows], rows.output, packed.maps.output_item)
        velocity = self.proj_out(out).split([t.num_output for t in packed.tokens])
        return [self._unpatchify(v, item) for v, item in zip(velocity, items, strict=True)]

    def _item_rows(self, items: list[DiTInput]) -> ItemRows:
        """Each item's timestep embedding and modulation rows, computed once per distinct timestep and
        one at a time: a GEMM's rows can depend on how many rows it has, and an item's output must not
        depend on its company (items at one timestep, a guidance pair or requests in step, share the
        same bits)."""
        device = items[0].latents.device
        distinct: dict[float, int] = {}  # timestep -> its row among the distinct ones
        for item in items:
            distinct.setdefault(item.timestep, len(distinct))
        timesteps = to_device(torch.tensor(list(distinct), dtype=torch.float32), device)
        # As the pipeline: t in the model dtype, / 1000 there; the model multiplies by 1000 again.
        model_timesteps = (timesteps.to(self.dtype) / 1000).to(self.dtype) * 1000
        per_timestep = []
        for index in range(len(distinct)):
            temb = self.time_guidance_embed(model_timesteps[index : index + 1])  # [1, dim]
            per_timestep.append(
                (
                    self.double_stream_modulation_img(temb),
                    self.double_stream_modulation_txt(temb),
                    self.single_stream_modulation(temb),
                    self.norm_out.rows(temb),
                )
            )
        which = [distinct[item.timestep] for item in items]

        def stacked(part: int) -> torch.Tensor:
            rows = [per_timestep[index][part] for index in which]
            return rows[0] if len(rows) == 1 else torch.cat(rows)  # [N, k * dim]

        return ItemRows(image=stacked(0), text=stacked(1), single=stacked(2), output=stacked(3))

    def run_blocks(self, txt, img, rows: ItemRows, packed: PackedTokens, attn) -> torch.Tensor:
        """Double-stream then single-stream blocks; returns the joint tokens [T, dim]."""
        txt, img = self.transformer_blocks(txt, img, rows, packed, attn)
        return self.single_transformer_blocks(packed.joint(txt, img), rows, packed, attn)

    @staticmethod
    def _image_tokens(item: DiTInput, dtype: torch.dtype) -> torch.Tensor:
        """[C, h, w] grids (output, then references) -> [sum h*w, C] tokens, row-major."""
        grids = [item.latents, *item.references]
        return torch.cat([g.to(dtype).flatten(1).transpose(0, 1) for g in grids])

    def _unpatchify(self, tokens: torch.Tensor, item: DiTInput) -> torch.Tensor:
        rows, cols = item.latents.shape[-2:]
        return tokens.transpose(0, 1).reshape(self.config.num_out_channels, rows, cols)
