"""One LTX-2 transformer block over packed video and audio tokens (keys as diffusers'
LTX2VideoTransformerBlock): self attention of each stream, text cross attention of each stream,
audio-to-video and video-to-audio cross attention, a feed-forward per stream.

Attention labels (planned once per forward by LTX2DiT.plan):
    video_self, audio_self     each item's tokens attend to themselves
    video_text, audio_text     each item's tokens attend to its text
    a2v, v2a                   each item's video attends to its audio and back; only the items
                               packed first (`num_cross` of them), the others are isolated
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mstar.models.ltx2.config import DiTConfig
from mstar.models.ltx2.dit_layers import Attention, FeedForward, RMSNorm, modulate

VIDEO_SELF, AUDIO_SELF = "video_self", "audio_self"
VIDEO_TEXT, AUDIO_TEXT = "video_text", "audio_text"
A2V, V2A = "a2v", "v2a"

Rope = tuple[torch.Tensor, torch.Tensor]


@dataclass
class StreamRows:
    """One stream's per-step conditioning: rows [R, N, D] (one per distinct timestep of the
    step's items, before each block adds its table) and the token -> row index of each."""

    modulation: torch.Tensor  # [R, 6 or 9, D] timestep modulation
    row_index: torch.Tensor  # [T] int64
    cross_scale_shift: torch.Tensor  # [R, 4, D] audio-video cross attention scale/shift
    cross_gate: torch.Tensor  # [R, 1, D]
    cross_row_index: torch.Tensor  # [T] int64
    text_modulation: torch.Tensor | None  # [R, 2, D] text key/value modulation (LTX-2.3)
    text_row_index: torch.Tensor | None  # [T_text] int64
    rope: Rope  # self attention rotary
    cross_rope: Rope  # audio-video cross attention rotary (time only)
    value_rows: torch.Tensor | None  # [T] bool: perturbed self attention (spatio-temporal guidance)


@dataclass
class BlockInputs:
    """Everything a block reads besides the two streams' hidden states."""

    video: StreamRows
    audio: StreamRows
    video_text: torch.Tensor | None  # [T_text, Dv] (after the caption projection); None: text_kv
    audio_text: torch.Tensor | None  # [T_text, Da]
    num_cross_video: int  # video tokens of the items that run audio-video cross attention
    num_cross_audio: int
    perturbed_blocks: frozenset[int]


def _with_table(table: torch.Tensor, rows: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """table [N, D] + rows [R, N, D], gathered per token -> N tensors [T, D] (get_mod_params)."""
    return tuple(param[index] for param in (table.to(rows.dtype) + rows).unbind(1))


class LTX2Block(nn.Module):
    def __init__(self, config: DiTConfig):
        super().__init__()
        c = config
        dim, audio_dim = c.inner_dim, c.audio_inner_dim
        eps, affine = c.norm_eps, c.norm_elementwise_affine
        bias, out_bias = c.attention_bias, c.attention_out_bias

        def attention(query_dim, heads, head_dim, kv_dim, gated):
            return Attention(query_dim, heads, head_dim, kv_dim, bias, out_bias, gated=gated)

        audio_heads, audio_head_dim = c.audio_num_attention_heads, c.audio_attention_head_dim
        self.norm1 = RMSNorm(dim, eps, affine)
        self.attn1 = attention(dim, c.num_attention_heads, c.attention_head_dim, None, c.gated_attn)
        self.audio_norm1 = RMSNorm(audio_dim, eps, affine)
        self.audio_attn1 = attention(audio_dim, audio_heads, audio_head_dim, None, c.audio_gated_attn)
        self.norm2 = RMSNorm(dim, eps, affine)
        self.attn2 = attention(
            dim, c.num_attention_heads, c.attention_head_dim, c.cross_attention_dim, c.gated_attn
        )
        self.audio_norm2 = RMSNorm(audio_dim, eps, affine)
        self.audio_attn2 = attention(
            audio_dim, audio_heads, audio_head_dim, c.audio_cross_attention_dim, c.audio_gated_attn
        )
        self.audio_to_video_norm = RMSNorm(dim, eps, affine)
        self.audio_to_video_attn = attention(dim, audio_heads, audio_head_dim, audio_dim, c.gated_attn)
        self.video_to_audio_norm = RMSNorm(audio_dim, eps, affine)
        self.video_to_audio_attn = attention(audio_dim, audio_heads, audio_head_dim, dim, c.audio_gated_attn)
        self.norm3 = RMSNorm(dim, eps, affine)
        self.ff = FeedForward(dim, bias=c.ff_bias)
        self.audio_norm3 = RMSNorm(audio_dim, eps, affine)
        self.audio_ff = FeedForward(audio_dim, bias=c.audio_ff_bias)

        self.video_query_modulation = c.cross_attn_mod
        self.audio_query_modulation = c.audio_cross_attn_mod
        self.scale_shift_table = nn.Parameter(torch.randn(9 if c.cross_attn_mod else 6, dim) / dim**0.5)
        self.audio_scale_shift_table = nn.Parameter(
            torch.randn(9 if c.audio_cross_attn_mod else 6, audio_dim) / audio_dim**0.5
        )
        self.text_modulation = c.prompt_modulation
        if self.text_modulation:
            self.prompt_scale_shift_table = nn.Parameter(torch.randn(2, dim))
            self.audio_prompt_scale_shift_table = nn.Parameter(torch.randn(2, audio_dim))
        self.video_a2v_cross_attn_scale_shift_table = nn.Parameter(torch.randn(5, dim))
        self.audio_a2v_cross_attn_scale_shift_table = nn.Parameter(torch.randn(5, audio_dim))

    def forward(
        self,
        perturbed: bool,
        video: torch.Tensor,
        audio: torch.Tensor,
        inputs: BlockInputs,
        attention,
        text_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """video [Tv, Dv], audio [Ta, Da] -> both after the block; `perturbed`: this block is one
        of the step's spatio-temporal guidance blocks; `text_kv`: this block's text keys and values
        (video [2, T_text, Dv], audio [2, T_text, Da]: LTX2DiT.text_kv), else from the text."""
        v_rows, a_rows = inputs.video, inputs.audio
        v_mod = _with_table(self.scale_shift_table, v_rows.modulation, v_rows.row_index)
        a_mod = _with_table(self.audio_scale_shift_table, a_rows.modulation, a_rows.row_index)
        video = self._self_attention(
            video, v_mod, inputs.video, self.norm1, self.attn1, VIDEO_SELF, perturbed, attention
        )
        audio = self._self_attention(
            audio, a_mod, inputs.audio, self.audio_norm1, self.audio_attn1, AUDIO_SELF, perturbed, attention
        )
        video_kv, audio_kv = (None, None) if text_kv is None else text_kv
        video = self._text_attention(video, v_mod, inputs, False, attention, video_kv)
        audio = self._text_attention(audio, a_mod, inputs, True, attention, audio_kv)
        if inputs.num_cross_video > 0:
            video, audio = self._audio_video_attention(video, audio, inputs, attention)
        video = video + self.ff(modulate(self.norm3(video), v_mod[4], v_mod[3])) * v_mod[5]
        audio = audio + self.audio_ff(modulate(self.audio_norm3(audio), a_mod[4], a_mod[3])) * a_mod[5]
        return video, audio

    @staticmethod
    def _self_attention(x, mod, rows: StreamRows, norm, attn, label, perturbed, attention) -> torch.Tensor:
        shift, scale, gate = mod[0], mod[1], mod[2]
        value_rows = rows.value_rows if perturbed else None
        out = attn(
            modulate(norm(x), scale, shift), attention, label, query_rope=rows.rope, value_rows=value_rows
        )
        return x + out * gate

    def _text_attention(self, x, mod, inputs: BlockInputs, audio_stream: bool, attention, kv) -> torch.Tensor:
        if audio_stream:
            norm, attn, label, text = self.audio_norm2, self.audio_attn2, AUDIO_TEXT, inputs.audio_text
            query_modulation, rows = self.audio_query_modulation, inputs.audio
            table = self.audio_prompt_scale_shift_table if self.text_modulation else None
        else:
            norm, attn, label, text = self.norm2, self.attn2, VIDEO_TEXT, inputs.video_text
            query_modulation, rows = self.video_query_modulation, inputs.video
            table = self.prompt_scale_shift_table if self.text_modulation else None
        normed = norm(x)
        if query_modulation:
            normed = modulate(normed, mod[7], mod[6])
        if kv is not None:  # the text's keys and values, computed once for the request
            out = attn.attend_context(normed, kv[0], kv[1], attention, label)
        else:
            if table is not None:
                text = self._modulated_text(text, table, rows)
            out = attn(normed, attention, label, context=text)
        if query_modulation:
            out = out * mod[8]
        return x + out

    @staticmethod
    def _modulated_text(text: torch.Tensor, table: torch.Tensor, rows: StreamRows) -> torch.Tensor:
        """LTX-2.3's key/value modulation of the text: static per layer, or timestep-dependent rows."""
        if rows.text_modulation is None:
            shift, scale = table.to(text.dtype).unbind(0)
        else:
            shift, scale = _with_table(table, rows.text_modulation, rows.text_row_index)
        return modulate(text, scale, shift)

    def _audio_video_attention(self, video, audio, inputs: BlockInputs, attention):
        """a2v and v2a on the leading `num_cross_*` tokens (the items not isolated); both read the
        streams as they were before either update."""
        nv, na = inputs.num_cross_video, inputs.num_cross_audio
        v_rows, a_rows = inputs.video, inputs.audio
        v_index, a_index = v_rows.cross_row_index[:nv], a_rows.cross_row_index[:na]
        v_table, a_table = (
            self.video_a2v_cross_attn_scale_shift_table,
            self.audio_a2v_cross_attn_scale_shift_table,
        )
        v_scale_shift = _with_table(v_table[:4], v_rows.cross_scale_shift, v_index)
        a_scale_shift = _with_table(a_table[:4], a_rows.cross_scale_shift, a_index)
        (a2v_gate,) = _with_table(v_table[4:], v_rows.cross_gate, v_index)
        (v2a_gate,) = _with_table(a_table[4:], a_rows.cross_gate, a_index)
        v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = v_scale_shift
        a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = a_scale_shift
        v_rope = tuple(t[:nv] for t in v_rows.cross_rope)
        a_rope = tuple(t[:na] for t in a_rows.cross_rope)
        normed_video = self.audio_to_video_norm(video[:nv])
        normed_audio = self.video_to_audio_norm(audio[:na])

        a2v = self.audio_to_video_attn(
            modulate(normed_video, v_a2v_scale, v_a2v_shift),
            attention,
            A2V,
            context=modulate(normed_audio, a_a2v_scale, a_a2v_shift),
            query_rope=v_rope,
            key_rope=a_rope,
        )
        v2a = self.video_to_audio_attn(
            modulate(normed_audio, a_v2a_scale, a_v2a_shift),
            attention,
            V2A,
            context=modulate(normed_video, v_v2a_scale, v_v2a_shift),
            query_rope=a_rope,
            key_rope=v_rope,
        )
        video = _add_prefix(video, a2v_gate * a2v)
        audio = _add_prefix(audio, v2a_gate * v2a)
        return video, audio


def _add_prefix(x: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """x with `update` added to its first update.shape[0] rows."""
    if update.shape[0] == x.shape[0]:
        return x + update
    return torch.cat([x[: update.shape[0]] + update, x[update.shape[0] :]])
