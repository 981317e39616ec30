"""LTX-2's text connectors (diffusers LTX2TextConnectors, same state-dict keys), one prompt at a time.

Gemma 3's per-layer hidden states [1, L, D, layers] -> (video text [L, Dv], audio text [L, Da]):
a masked per-layer normalisation (LTX-2) or a per-token RMS norm (LTX-2.3), a projection, then a
small bidirectional transformer per stream. With learned registers the prompt's tokens move to the
front and registers fill the rest, so all L tokens are real; without, the padded positions still
run as queries over the prompt's tokens. Either way diffusers hands the DiT all L tokens (its
returned mask is all ones), and so do we.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mstar.engine.attention import AttentionLayout
from mstar.models.ltx2 import rope
from mstar.models.ltx2.config import ConnectorsConfig, from_json_dict
from mstar.models.ltx2.dit_layers import Attention, FeedForward

CONNECTOR_LABEL = "connector"
EPS = 1e-6


def per_layer_masked_mean_norm(
    hidden: torch.Tensor, num_valid: int, padding_side: str, scale_factor: float = 8.0
) -> torch.Tensor:
    """[1, L, D, layers] -> [1, L, D * layers]: each layer centred on its masked mean and divided by
    its masked range, times `scale_factor`; padded positions zero (diffusers per_layer_masked_mean_norm)."""
    _, seq_len, dim, num_layers = hidden.shape
    mask = _valid_mask(seq_len, num_valid, padding_side, hidden.device)[None, :, None, None]  # [1, L, 1, 1]
    masked = hidden.masked_fill(~mask, 0.0)
    mean = masked.sum(dim=(1, 2), keepdim=True) / (
        torch.tensor([num_valid * dim], device=hidden.device) + EPS
    )
    x_min = hidden.masked_fill(~mask, float("inf")).amin(dim=(1, 2), keepdim=True)
    x_max = hidden.masked_fill(~mask, float("-inf")).amax(dim=(1, 2), keepdim=True)
    normed = (hidden - mean) / (x_max - x_min + EPS) * scale_factor
    normed = normed.flatten(2).masked_fill(~mask.squeeze(-1).expand(-1, -1, dim * num_layers), 0.0)
    return normed.to(hidden.dtype)


def per_token_rms_norm(hidden: torch.Tensor) -> torch.Tensor:
    """[1, L, D, layers]: every token of every layer RMS-normalised over D (LTX-2.3)."""
    variance = torch.mean(hidden**2, dim=2, keepdim=True)
    return hidden * torch.rsqrt(variance + EPS)


def _valid_mask(seq_len: int, num_valid: int, padding_side: str, device) -> torch.Tensor:
    positions = torch.arange(seq_len, device=device)
    if padding_side == "left":
        return positions >= seq_len - num_valid
    if padding_side == "right":
        return positions < num_valid
    raise ValueError(f"padding_side must be 'left' or 'right', got '{padding_side}'")


class ConnectorBlock(nn.Module):
    """diffusers LTX2TransformerBlock1d: RMS norm, self attention with 1-D rotary, RMS norm, FFN."""

    def __init__(self, dim: int, heads: int, head_dim: int, gated: bool):
        super().__init__()
        self.norm1 = nn.RMSNorm(dim, eps=EPS, elementwise_affine=False)
        self.attn1 = Attention(dim, heads, head_dim, gated=gated)
        self.norm2 = nn.RMSNorm(dim, eps=EPS, elementwise_affine=False)
        self.ff = FeedForward(dim)

    def forward(self, x, tables, attention, key_rows: slice) -> torch.Tensor:
        """x [L, D]; keys and values from rows `key_rows` of it (all of them with registers)."""
        normed = self.norm1(x)
        if key_rows.stop - key_rows.start == x.shape[0]:
            out = self.attn1(normed, attention, CONNECTOR_LABEL, query_rope=tables)
        else:
            key_tables = tuple(t[key_rows] for t in tables)
            out = self.attn1(
                normed,
                attention,
                CONNECTOR_LABEL,
                context=normed[key_rows],
                query_rope=tables,
                key_rope=key_tables,
            )
        x = x + out
        return x + self.ff(self.norm2(x))


class ConnectorTransformer(nn.Module):
    """diffusers LTX2ConnectorTransformer1d (keys learnable_registers, transformer_blocks.*)."""

    def __init__(self, heads, head_dim, num_layers, num_registers, gated: bool, config: ConnectorsConfig):
        super().__init__()
        self.inner_dim = heads * head_dim
        self.heads = heads
        self.config = config
        self.num_registers = num_registers
        self.learnable_registers = None
        if num_registers is not None:
            self.learnable_registers = nn.Parameter(torch.rand(num_registers, self.inner_dim) * 2.0 - 1.0)
        self.transformer_blocks = nn.ModuleList(
            ConnectorBlock(self.inner_dim, heads, head_dim, gated) for _ in range(num_layers)
        )
        self.norm_out = nn.RMSNorm(self.inner_dim, eps=EPS, elementwise_affine=False)

    def forward(self, x: torch.Tensor, num_valid: int, padding_side: str, attention) -> torch.Tensor:
        """x [L, D] with `num_valid` prompt tokens -> [L, D]."""
        seq_len = x.shape[0]
        key_rows = slice(0, seq_len)
        if self.learnable_registers is not None:
            if seq_len % self.num_registers:
                raise ValueError(
                    f"text of {seq_len} tokens: must be a multiple of {self.num_registers} registers"
                )
            registers = self.learnable_registers.repeat(seq_len // self.num_registers, 1)  # [L, D], tiled
            valid = x[seq_len - num_valid :] if padding_side == "left" else x[:num_valid]
            x = torch.cat([valid, registers[num_valid:].to(x.dtype)])
        elif padding_side == "left":
            key_rows = slice(seq_len - num_valid, seq_len)  # padded positions query the prompt only
        else:
            key_rows = slice(0, num_valid)
        c = self.config
        tables = rope.rope_tables(
            rope.connector_positions(seq_len), self.inner_dim, (c.connector_rope_base_seq_len,), c.rope_theta,
            c.rope_double_precision, c.rope_type, self.heads,
        )  # fmt: skip
        tables = tuple(t.to(x.device) for t in tables)
        attention.plan(
            CONNECTOR_LABEL, AttentionLayout.cross_attention([seq_len], [key_rows.stop - key_rows.start])
        )
        for block in self.transformer_blocks:
            x = block(x, tables, attention, key_rows)
        return self.norm_out(x)


class LTX2TextConnectors(nn.Module):
    def __init__(self, config: ConnectorsConfig):
        super().__init__()
        c = self.config = config
        features = c.caption_channels * c.text_proj_in_factor
        if c.per_modality_projections:
            self.video_text_proj_in = nn.Linear(features, c.video_hidden_dim, bias=c.proj_bias)
            self.audio_text_proj_in = nn.Linear(features, c.audio_hidden_dim, bias=c.proj_bias)
        else:
            self.text_proj_in = nn.Linear(features, c.caption_channels, bias=c.proj_bias)
        self.video_connector = ConnectorTransformer(
            c.video_connector_num_attention_heads, c.video_connector_attention_head_dim, c.video_connector_num_layers,
            c.video_connector_num_learnable_registers, c.video_gated_attn, c,
        )  # fmt: skip
        self.audio_connector = ConnectorTransformer(
            c.audio_connector_num_attention_heads, c.audio_connector_attention_head_dim, c.audio_connector_num_layers,
            c.audio_connector_num_learnable_registers, c.audio_gated_attn, c,
        )  # fmt: skip

    @classmethod
    def from_config(cls, config: ConnectorsConfig | dict) -> LTX2TextConnectors:
        if isinstance(config, dict):
            config = from_json_dict(ConnectorsConfig, config)
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def forward(
        self, hidden: torch.Tensor, num_valid: int, attention, padding_side: str = "left"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt's per-layer hidden states [1, L, D, layers] (its `num_valid` tokens padded to L)
        -> (video text [L, Dv], audio text [L, Da]), everything the DiT attends to."""
        c = self.config
        if c.per_modality_projections:
            normed = per_token_rms_norm(hidden).flatten(2, 3)
            mask = _valid_mask(hidden.shape[1], num_valid, padding_side, hidden.device)[None, :, None]
            normed = torch.where(mask, normed, torch.zeros_like(normed))
            video = self.video_text_proj_in(normed * math.sqrt(c.video_hidden_dim / c.caption_channels))
            audio = self.audio_text_proj_in(normed * math.sqrt(c.audio_hidden_dim / c.caption_channels))
        else:
            video = audio = self.text_proj_in(per_layer_masked_mean_norm(hidden, num_valid, padding_side))
        video = self.video_connector(video[0], num_valid, padding_side, attention)
        audio = self.audio_connector(audio[0], num_valid, padding_side, attention)
        return video, audio
