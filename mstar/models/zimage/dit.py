"""The Z-Image single-stream DiT over packed tokens (state-dict keys as diffusers'
ZImageTransformer2DModel).

Parity note on padding. Diffusers pads each caption and each image token run to a multiple of
SEQ_MULTI_OF (32) with a learned pad token (`cap_pad_token`, `x_pad_token`), and those inner pad
tokens are NOT masked: real tokens attend to them in the refiners and the main layers (only the
padding that batches items of different lengths is masked). The released model runs that way, so we
keep the inner pad tokens in our packed segments (they change the real tokens' outputs) and drop
the batch padding, which our ragged segments never need.

Segment order per item in the main layers is [image tokens, caption tokens], as in diffusers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mstar.diffusion.packing import bounded_cache_get, pad_rows
from mstar.engine.attention import AttentionLayout
from mstar.engine.transfer import to_device
from mstar.models.zimage.config import DiTConfig, from_json_dict
from mstar.models.zimage.geometry import SEQ_MULTI_OF, padded_len

__all__ = ["SEQ_MULTI_OF", "DiTInput", "ZImageDiT", "padded_len"]
from mstar.models.zimage.dit_layers import (
    ADALN_EMBED_DIM,
    FinalLayer,
    ModulatedBlocks,
    RMSNorm,
    RopeTables,
    TimestepEmbedder,
)
from mstar.models.zimage.dit_layers import TransformerBlock as Block

MAX_CACHED_LAYOUTS = 64  # rotary tables and token -> item maps, per geometry (sizes repeat every step)
# Attention labels planned once per forward.
IMAGE_REFINER_LABEL = "image_refiner"
TEXT_REFINER_LABEL = "text_refiner"
SELF_LABEL = "self"


@dataclass
class DiTInput:
    """One item of a packed forward: latents [C, H, W] (latent cells), timestep in the model's
    [0, 1] scale ((1000 - t) / 1000 as the pipeline passes it: 0 is pure noise, 1 is clean),
    caption [L, cap_dim] (the text encoder's kept tokens); refined_caption: the caption's tokens
    after the context refiner ([padded L, dim], `ZImageDiT.refine_caption`), when the caller kept
    them from an earlier step (they do not depend on the timestep)."""

    latents: torch.Tensor
    timestep: float
    caption: torch.Tensor
    refined_caption: torch.Tensor | None = None


@dataclass(frozen=True)
class ItemGeometry:
    """Token counts of one item: real and padded image tokens, real and padded caption tokens."""

    height: int
    width: int
    num_image: int
    num_image_padded: int
    num_caption: int
    num_caption_padded: int

    @property
    def num_tokens(self) -> int:
        return self.num_image_padded + self.num_caption_padded


class ZImageDiT(nn.Module):
    # What the scaffold compiles (mstar.engine.compile.compile_methods), once each with the pack
    # length dynamic: the noise refiner (image tokens: eager it is a dozen memory-bound passes per
    # layer over [T, dim]) and the main layers. The context refiner stays eager: captions are short
    # and their lengths would tie to table sizes. One graph each serves every item count: the item
    # rows are never one (pad_rows) and no duck shapes (see CompiledFunction).
    compiled_methods = ("run_noise_refiner", "run_layers")

    def __init__(self, config: DiTConfig):
        super().__init__()
        if config.head_dim != sum(config.axes_dims):
            raise ValueError(f"head_dim {config.head_dim} must equal sum(axes_dims) {sum(config.axes_dims)}")
        self.config = config
        dim, p, pf = config.dim, config.patch_size, config.f_patch_size
        key = f"{p}-{pf}"
        patch_dim = pf * p * p * config.in_channels
        self.all_x_embedder = nn.ModuleDict({key: nn.Linear(patch_dim, dim, bias=True)})
        self.all_final_layer = nn.ModuleDict({key: FinalLayer(dim, patch_dim)})

        def blocks(count: int, modulation: bool) -> list[Block]:
            return [
                Block(dim, config.n_heads, config.norm_eps, config.qk_norm, modulation) for _ in range(count)
            ]

        self.noise_refiner = ModulatedBlocks(blocks(config.n_refiner_layers, True))
        self.context_refiner = nn.ModuleList(blocks(config.n_refiner_layers, False))
        self.t_embedder = TimestepEmbedder(min(dim, ADALN_EMBED_DIM))
        self.cap_embedder = nn.Sequential(
            RMSNorm(config.cap_feat_dim, eps=config.norm_eps), nn.Linear(config.cap_feat_dim, dim, bias=True)
        )
        self.x_pad_token = nn.Parameter(torch.zeros((1, dim)))
        self.cap_pad_token = nn.Parameter(torch.zeros((1, dim)))
        self.layers = ModulatedBlocks(blocks(config.n_layers, True))
        self.rope = RopeTables(config.rope_theta, config.axes_dims, config.axes_lens)
        self._key = key
        self._layout_cache: dict[tuple, tuple[torch.Tensor, ...]] = {}

    @classmethod
    def from_config(cls, config: DiTConfig | dict) -> ZImageDiT:
        if isinstance(config, dict):
            config = from_json_dict(DiTConfig, config)
        return cls(config)

    # ---- geometry and host-side layout ---------------------------------------------------------
    def geometry(self, item: DiTInput) -> ItemGeometry:
        p = self.config.patch_size
        _, height, width = item.latents.shape
        num_image = (height // p) * (width // p)
        num_caption = item.caption.shape[0]
        return ItemGeometry(
            height, width, num_image, padded_len(num_image), num_caption, padded_len(num_caption)
        )

    def _position_ids(self, geo: ItemGeometry, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(image [Nx, 3], caption [Nc, 3]) int position ids as diffusers assigns them: caption
        (1 + j, 0, 0) for every padded caption slot; image (Nc + 1, h, w), image pads (0, 0, 0)."""
        cap_pos = torch.zeros(geo.num_caption_padded, 3, dtype=torch.long, device=device)
        cap_pos[:, 0] = torch.arange(1, geo.num_caption_padded + 1, device=device)
        p = self.config.patch_size
        rows = torch.arange(geo.height // p, device=device)
        cols = torch.arange(geo.width // p, device=device)
        grid_h, grid_w = torch.meshgrid(rows, cols, indexing="ij")
        img_pos = torch.zeros(geo.num_image_padded, 3, dtype=torch.long, device=device)
        img_pos[: geo.num_image, 0] = geo.num_caption_padded + 1
        img_pos[: geo.num_image, 1] = grid_h.flatten()
        img_pos[: geo.num_image, 2] = grid_w.flatten()
        return img_pos, cap_pos

    def _item_rope(self, geo: ItemGeometry, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(image cos, image sin, caption cos, caption sin) of one geometry, each [N, head_dim/2]."""

        def build() -> tuple[torch.Tensor, ...]:
            img_pos, cap_pos = self._position_ids(geo, device)
            return (*self.rope(img_pos), *self.rope(cap_pos))

        return bounded_cache_get(self._layout_cache, ("rope", geo, str(device)), build, MAX_CACHED_LAYOUTS)

    def _token_items(self, lens: list[int], device: torch.device) -> torch.Tensor:
        """Item index of every packed token [sum lens], made on the device (no host sync)."""

        def build() -> tuple[torch.Tensor]:
            items = [torch.full((n,), i, dtype=torch.long, device=device) for i, n in enumerate(lens)]
            return (torch.cat(items),)

        key = ("items", tuple(lens), str(device))
        return bounded_cache_get(self._layout_cache, key, build, MAX_CACHED_LAYOUTS)[0]

    def plan(self, attn, geometries: list[ItemGeometry]) -> None:
        """The image refiner and the main layers; the text refiner plans in refine_caption."""
        attn.plan(
            IMAGE_REFINER_LABEL, AttentionLayout.self_attention([g.num_image_padded for g in geometries])
        )
        attn.plan(SELF_LABEL, AttentionLayout.self_attention([g.num_tokens for g in geometries]))

    # ---- per-item patchify / embed -------------------------------------------------------------
    def _patchify(self, latents: torch.Tensor) -> torch.Tensor:
        """[C, H, W] -> [(H/p)*(W/p), p*p*C] (channel fastest, as diffusers with F = 1)."""
        p = self.config.patch_size
        channels, height, width = latents.shape
        patches = latents.view(channels, height // p, p, width // p, p).permute(1, 3, 2, 4, 0)
        return patches.reshape((height // p) * (width // p), p * p * channels)

    def _unpatchify(self, tokens: torch.Tensor, geo: ItemGeometry) -> torch.Tensor:
        """[num_image, p*p*C] -> [C, H, W]."""
        p, channels = self.config.patch_size, self.config.in_channels
        grid = tokens.view(geo.height // p, geo.width // p, p, p, channels)
        return grid.permute(4, 0, 2, 1, 3).reshape(channels, geo.height, geo.width)

    @staticmethod
    def _with_pads(tokens: torch.Tensor, num_padded: int, pad_token: torch.Tensor) -> torch.Tensor:
        num_pad = num_padded - tokens.shape[0]
        if num_pad == 0:
            return tokens
        return torch.cat([tokens, pad_token.to(tokens.dtype).expand(num_pad, -1)], dim=0)

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, items: list[DiTInput], attn) -> list[torch.Tensor]:
        """Predict the flow for every item in one packed pass; returns [C, H, W] per item."""
        device = items[0].latents.device
        dtype = self.all_x_embedder[self._key].weight.dtype
        geos = [self.geometry(item) for item in items]
        self.plan(attn, geos)

        timesteps = to_device(torch.tensor([item.timestep for item in items], dtype=torch.float32), device)
        item_emb = self.t_embedder(timesteps * self.config.t_scale).to(dtype)  # [num_items, adaln_dim]
        item_emb = pad_rows(item_emb)  # one graph for every item count (compiled_methods)

        x, x_rope, x_item, cap_rope = self._embed(items, geos, dtype, device)
        x = self.run_noise_refiner(x, x_rope[0], x_rope[1], item_emb, x_item, attn)
        cap = torch.cat([self._refined(item, attn) for item in items])

        unified, rope, token_item = self._unify(geos, x, x_rope, cap, cap_rope, device)
        unified = self.run_layers(unified, rope[0], rope[1], item_emb, token_item, attn)
        return self._split_outputs(unified, geos)

    def run_noise_refiner(self, x, cos, sin, item_emb, x_item, attn) -> torch.Tensor:
        """Noise refiner over the packed image tokens [sum Nx, dim]."""
        return self.noise_refiner(x, (cos, sin), attn, IMAGE_REFINER_LABEL, item_emb, x_item)

    def run_layers(self, unified, cos, sin, item_emb, token_item, attn) -> torch.Tensor:
        """Main layers and final layer over the packed [image_i, caption_i] tokens [T, dim]."""
        unified = self.layers(unified, (cos, sin), attn, SELF_LABEL, item_emb, token_item)
        return self.all_final_layer[self._key](unified, item_emb, token_item)

    def refine_caption(self, caption: torch.Tensor, attn) -> torch.Tensor:
        """One caption [L, cap_dim] -> its tokens after the context refiner [padded L, dim].

        The caption does not change over a request's steps and the context refiner has no timestep
        modulation, so callers keep this from the first step (DiTInput.refined_caption). Always one
        caption at a time: its result does not depend on which requests share its first step."""
        dtype = self.all_x_embedder[self._key].weight.dtype
        num_padded = padded_len(caption.shape[0])
        tokens = self._with_pads(self.cap_embedder(caption.to(dtype)), num_padded, self.cap_pad_token)
        geo = ItemGeometry(0, 0, 0, 0, caption.shape[0], num_padded)
        _, _, cos, sin = self._item_rope(geo, tokens.device)
        attn.plan(TEXT_REFINER_LABEL, AttentionLayout.self_attention([num_padded]))
        for layer in self.context_refiner:
            tokens = layer(tokens, (cos, sin), attn, TEXT_REFINER_LABEL)
        return tokens

    def _refined(self, item: DiTInput, attn) -> torch.Tensor:
        if item.refined_caption is not None:
            return item.refined_caption
        return self.refine_caption(item.caption, attn)

    def _embed(self, items, geos, dtype, device):
        """Embedded image tokens [sum Nx, dim], the image and caption rotary tables, and the item
        index of every image token."""
        patches = torch.cat([self._patchify(item.latents.to(dtype)) for item in items])
        x_tokens = self.all_x_embedder[self._key](patches).split([g.num_image for g in geos])
        x = torch.cat(
            [
                self._with_pads(t, g.num_image_padded, self.x_pad_token)
                for t, g in zip(x_tokens, geos, strict=True)
            ]
        )
        ropes = [self._item_rope(g, device) for g in geos]
        x_rope = (torch.cat([r[0] for r in ropes]), torch.cat([r[1] for r in ropes]))
        cap_rope = (torch.cat([r[2] for r in ropes]), torch.cat([r[3] for r in ropes]))
        x_item = self._token_items([g.num_image_padded for g in geos], device)
        return x, x_rope, x_item, cap_rope

    def _unify(self, geos, x, x_rope, cap, cap_rope, device):
        """Interleave per item: [image_i, caption_i] for i in items (tokens and rotary tables)."""
        x_lens = [g.num_image_padded for g in geos]
        cap_lens = [g.num_caption_padded for g in geos]

        def interleave(image_part: torch.Tensor, caption_part: torch.Tensor) -> torch.Tensor:
            parts = []
            for img, c in zip(image_part.split(x_lens), caption_part.split(cap_lens), strict=True):
                parts += [img, c]
            return torch.cat(parts)

        unified = interleave(x, cap)
        rope = (interleave(x_rope[0], cap_rope[0]), interleave(x_rope[1], cap_rope[1]))
        token_item = self._token_items([g.num_tokens for g in geos], device)
        return unified, rope, token_item

    def _split_outputs(self, unified: torch.Tensor, geos: list[ItemGeometry]) -> list[torch.Tensor]:
        outputs = []
        for tokens, geo in zip(unified.split([g.num_tokens for g in geos]), geos, strict=True):
            outputs.append(self._unpatchify(tokens[: geo.num_image], geo))
        return outputs
