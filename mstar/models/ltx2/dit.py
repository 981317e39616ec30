"""The LTX-2 DiT (diffusers LTX2VideoTransformer3DModel, same state-dict keys) over a packed list of
items: every item's video and audio tokens ride in one forward.

    dit = LTX2DiT(DiTConfig(...))                        # load weights with mstar.models.checkpoint
    attn = build_attention("auto", device, dtype)
    text_kv = dit.text_kv(video_text, audio_text)       # once per text: reuse it at every step
    outs = dit([DiTInput(video, audio, timestep, video_text, audio_text, text_kv=text_kv), ...], attn)
    video_velocity, audio_velocity = outs[0]            # [C, F, H, W] and [C, L, M] per item

Each item has its own size, duration, timestep, text and guidance label (cond, uncond, perturbed,
isolated: see geometry.guidance_labels); a cross-request step is all items of all requests.
Patchify and rotary tables are per item; the layer stack runs once over the packed tokens, with
video self attention, audio self attention, the two text cross attentions and the audio-video
cross attentions each a ragged pass planned once per call (dit_block's labels).

The text cross attention's keys and values depend on the text alone (except under LTX-2.3's text
modulation), so a request computes them once (`text_kv`: per layer, the caption projection, to_k,
norm_k and to_v of one text) and passes them at every step; an item without them gets them
computed in the forward. At the released size that is 1.2 GB a text, against about 4 TFLOP a pass
of each step spent projecting it again.
"""

from __future__ import annotations

import torch
from torch import nn

from mstar.engine.attention import AttentionLayout
from mstar.engine.transfer import to_device
from mstar.models.ltx2.config import DiTConfig, from_json_dict
from mstar.models.ltx2.dit_block import (
    A2V,
    AUDIO_SELF,
    AUDIO_TEXT,
    V2A,
    VIDEO_SELF,
    VIDEO_TEXT,
    BlockInputs,
    LTX2Block,
    StreamRows,
)
from mstar.models.ltx2.dit_layers import AdaLayerNormSingle
from mstar.models.ltx2.dit_pack import (
    DiTInput,
    Layout,
    RopeCache,
    build_layout,
    patchify_audio,
    patchify_video,
    unpatchify_audio,
    unpatchify_video,
)
from mstar.models.wan22.dit_layers import TextProjection  # the same PixArtAlphaTextProjection

__all__ = ["DiTInput", "LTX2DiT"]


class LTX2DiT(nn.Module):
    # One block, compiled with the pack lengths dynamic and run for each of the 48, then the output
    # heads (scaffold.speed_up puts the compiled copies on the instance; run_layers calls them by
    # these names). The blocks share one graph, their weights its inputs: the unrolled stack took
    # over five minutes to compile on the H200 (on a CPU at tiny widths, about 16 s a block).
    compiled_methods = ("run_block", "run_heads")

    def __init__(self, config: DiTConfig):
        super().__init__()
        self.config = c = config
        dim, audio_dim = c.inner_dim, c.audio_inner_dim
        patch_features = c.in_channels * c.patch_size_t * c.patch_size**2
        self.proj_in = nn.Linear(patch_features, dim)
        self.audio_proj_in = nn.Linear(c.audio_in_channels, audio_dim)
        if c.use_keyframes_abs_pos_embedding:
            # Read by the keyframe pipelines only; kept so their checkpoints load.
            self.keyframes_abs_pos_embedding = nn.Parameter(torch.zeros(1, dim))
        if c.use_prompt_embeddings:
            self.caption_projection = TextProjection(c.caption_channels, dim)
            self.audio_caption_projection = TextProjection(c.caption_channels, audio_dim)
        self.time_embed = AdaLayerNormSingle(dim, 9 if c.cross_attn_mod else 6)
        self.audio_time_embed = AdaLayerNormSingle(audio_dim, 9 if c.audio_cross_attn_mod else 6)
        self.av_cross_attn_video_scale_shift = AdaLayerNormSingle(dim, 4)
        self.av_cross_attn_audio_scale_shift = AdaLayerNormSingle(audio_dim, 4)
        self.av_cross_attn_video_a2v_gate = AdaLayerNormSingle(dim, 1)
        self.av_cross_attn_audio_v2a_gate = AdaLayerNormSingle(audio_dim, 1)
        self.scale_shift_table = nn.Parameter(torch.randn(2, dim) / dim**0.5)
        self.audio_scale_shift_table = nn.Parameter(torch.randn(2, audio_dim) / audio_dim**0.5)
        self.timestep_text_modulation = c.prompt_modulation and c.use_prompt_adaln_single
        if self.timestep_text_modulation:
            self.prompt_adaln = AdaLayerNormSingle(dim, 2)
            self.audio_prompt_adaln = AdaLayerNormSingle(audio_dim, 2)
        self.transformer_blocks = nn.ModuleList(LTX2Block(c) for _ in range(c.num_layers))
        self.norm_out = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.proj_out = nn.Linear(dim, c.video_out_channels * c.patch_size_t * c.patch_size**2)
        self.audio_norm_out = nn.LayerNorm(audio_dim, eps=1e-6, elementwise_affine=False)
        self.audio_proj_out = nn.Linear(audio_dim, c.audio_output_channels)
        self.ropes = RopeCache(c)

    @classmethod
    def from_config(cls, config: DiTConfig | dict) -> LTX2DiT:
        if isinstance(config, dict):
            config = from_json_dict(DiTConfig, config)
        return cls(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj_in.weight.device

    # ---- forward -------------------------------------------------------------------------------
    def forward(
        self, items: list[DiTInput], attention, perturbed_blocks: tuple[int, ...] = ()
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(video velocity [C, F, H, W], audio velocity [C, L, M]) per item, in the model dtype.

        perturbed_blocks: the blocks whose self attention the `perturbed` items skip (the step's
        spatio-temporal guidance blocks); ignored, as diffusers does, without perturbed attention."""
        if not items:
            raise ValueError("LTX2DiT needs at least one item")
        layout = build_layout(items, self.config)
        ordered = [items[i] for i in layout.order]
        self.plan(attention, layout)
        video, audio = self._embed_latents(ordered)
        text_kv = self._packed_text_kv(ordered)
        inputs, video_head, audio_head = self._block_inputs(
            ordered, layout, perturbed_blocks, text_kv is None
        )
        video_out, audio_out = self.run_layers(
            video, audio, inputs, video_head, audio_head, attention, text_kv
        )
        return self._unpack(video_out, audio_out, layout)

    @property
    def keeps_text_kv(self) -> bool:
        """Whether the text's cross-attention keys and values depend on the text alone, so that a
        request can compute them once (text_kv): not with LTX-2.3's text modulation."""
        return not self.config.prompt_modulation

    def text_kv(
        self, video_text: torch.Tensor, audio_text: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One item's texts (the connectors' outputs) -> the text cross-attention keys (normed) and
        values of every block: video [num_layers, 2, L, Dv], audio [num_layers, 2, L, Da].

        One text per call: BLAS picks its kernel by row count, so batching several items' text
        would make an item's keys depend on its company (see AdaLayerNormSingle.rows)."""
        if not self.keeps_text_kv:
            raise ValueError("this LTX-2 modulates its text by the timestep: no text_kv to keep")
        device, dtype = self.device, self.dtype
        video, audio = video_text.to(device, dtype), audio_text.to(device, dtype)
        if self.config.use_prompt_embeddings:
            video, audio = self.caption_projection(video), self.audio_caption_projection(audio)
        num_layers = len(self.transformer_blocks)
        # Written in place: one buffer a stream instead of per-layer tensors plus a stacked copy.
        video_kv = video.new_empty(num_layers, 2, video.shape[0], self.config.inner_dim)
        audio_kv = audio.new_empty(num_layers, 2, audio.shape[0], self.config.audio_inner_dim)
        for index, block in enumerate(self.transformer_blocks):
            video_kv[index, 0], video_kv[index, 1] = block.attn2.context_key_value(video)
            audio_kv[index, 0], audio_kv[index, 1] = block.audio_attn2.context_key_value(audio)
        return video_kv, audio_kv

    def _packed_text_kv(self, items: list[DiTInput]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Every item's text_kv (computed now where an item carries none), in packing order; None
        where the text is modulated per step."""
        if not self.keeps_text_kv:
            return None
        kvs = [item.text_kv or self.text_kv(item.video_text, item.audio_text) for item in items]
        for (video, audio), item in zip(kvs, items, strict=True):
            expected = (len(self.transformer_blocks), 2, item.video_text.shape[0])
            if tuple(video.shape[:3]) != expected or tuple(audio.shape[:3]) != expected:
                raise ValueError(f"text_kv must be [{expected[0]}, 2, {expected[2]}, D] for each stream")
        return kvs

    def plan(self, attention, layout: Layout) -> None:
        video, audio, text = layout.video_counts, layout.audio_counts, layout.text_counts
        attention.plan(VIDEO_SELF, AttentionLayout.self_attention(video))
        attention.plan(AUDIO_SELF, AttentionLayout.self_attention(audio))
        attention.plan(VIDEO_TEXT, AttentionLayout.cross_attention(video, text))
        attention.plan(AUDIO_TEXT, AttentionLayout.cross_attention(audio, text))
        num_cross = layout.num_cross_items
        if num_cross > 0:
            attention.plan(A2V, AttentionLayout.cross_attention(video[:num_cross], audio[:num_cross]))
            attention.plan(V2A, AttentionLayout.cross_attention(audio[:num_cross], video[:num_cross]))

    def run_layers(self, video, audio, inputs: BlockInputs, video_head, audio_head, attention, text_kv=None):
        """The block stack and both output heads over packed tokens: video [Tv, Dv], audio [Ta, Da]
        -> (video patches [Tv, C*pt*p*p], audio features [Ta, C*M]). text_kv: each item's text keys
        and values (LTX2DiT.text_kv), packed layer by layer; None to project the text."""
        for index, block in enumerate(self.transformer_blocks):
            perturbed = index in inputs.perturbed_blocks
            layer_kv = None if text_kv is None else _layer_text_kv(text_kv, index)
            video, audio = self.run_block(block, perturbed, video, audio, inputs, attention, layer_kv)
        return self.run_heads(video, audio, video_head, audio_head)

    def run_block(self, block, perturbed: bool, video, audio, inputs: BlockInputs, attention, text_kv=None):
        """One block (video [Tv, Dv], audio [Ta, Da] -> both after it): the part worth compiling."""
        return block(perturbed, video, audio, inputs, attention, text_kv)

    def run_heads(self, video, audio, video_head, audio_head):
        video = self._output_head(video, self.norm_out, self.proj_out, self.scale_shift_table, *video_head)
        audio = self._output_head(
            audio, self.audio_norm_out, self.audio_proj_out, self.audio_scale_shift_table, *audio_head
        )
        return video, audio

    @staticmethod
    def _output_head(x, norm, proj, table, embedded_rows, row_index) -> torch.Tensor:
        """LayerNorm, then per-token shift/scale from the timestep embedding, then the projection."""
        shift, scale = (table.to(embedded_rows.dtype)[None] + embedded_rows[:, None]).unbind(1)  # [R, D]
        return proj(norm(x) * (1 + scale[row_index]) + shift[row_index])

    # ---- packing -------------------------------------------------------------------------------
    def _embed_latents(self, items: list[DiTInput]) -> tuple[torch.Tensor, torch.Tensor]:
        device, dtype = self.device, self.dtype
        video = torch.cat(
            [patchify_video(item.video_latents.to(device, dtype), self.config) for item in items]
        )
        audio = torch.cat([patchify_audio(item.audio_latents.to(device, dtype)) for item in items])
        return self.proj_in(video), self.audio_proj_in(audio)

    def _texts(self, items: list[DiTInput]) -> tuple[torch.Tensor, torch.Tensor]:
        device, dtype = self.device, self.dtype
        video = torch.cat([item.video_text.to(device, dtype) for item in items])
        audio = torch.cat([item.audio_text.to(device, dtype) for item in items])
        if self.config.use_prompt_embeddings:
            video, audio = self.caption_projection(video), self.audio_caption_projection(audio)
        return video, audio

    def _block_inputs(
        self, items: list[DiTInput], layout: Layout, perturbed_blocks: tuple[int, ...], project_text: bool
    ):
        device, dtype, c = self.device, self.dtype, self.config
        timesteps = to_device(layout.timesteps, device)  # no host sync
        gate_timesteps = timesteps * (c.cross_attn_timestep_scale_multiplier / c.timestep_scale_multiplier)
        video_mod, video_embedded = self.time_embed.rows(timesteps, dtype)
        audio_mod, audio_embedded = self.audio_time_embed.rows(timesteps, dtype)
        video_row, audio_row = to_device(layout.video_row, device), to_device(layout.audio_row, device)
        text_row = to_device(layout.text_row, device)
        video_ropes = [
            self.ropes.video(g.video_grid, it.frame_rate, device)
            for g, it in zip(layout.geometries, items, strict=True)
        ]
        audio_ropes = [self.ropes.audio(g.audio_frames, device) for g in layout.geometries]
        value_rows = self._value_rows(items, layout, perturbed_blocks)
        video_text_mod = audio_text_mod = None
        if self.timestep_text_modulation:
            video_text_mod = self.prompt_adaln.rows(timesteps, dtype)[0]
            audio_text_mod = self.audio_prompt_adaln.rows(timesteps, dtype)[0]
        video_rows = StreamRows(
            modulation=video_mod,
            row_index=video_row,
            cross_scale_shift=self.av_cross_attn_video_scale_shift.rows(timesteps, dtype)[0],
            cross_gate=self.av_cross_attn_video_a2v_gate.rows(gate_timesteps, dtype)[0],
            cross_row_index=to_device(layout.video_cross_row, device),
            text_modulation=video_text_mod,
            text_row_index=text_row if video_text_mod is not None else None,
            rope=_cat_tables(video_ropes, 0),
            cross_rope=_cat_tables(video_ropes, 2),
            value_rows=value_rows[0],
        )
        audio_rows = StreamRows(
            modulation=audio_mod,
            row_index=audio_row,
            cross_scale_shift=self.av_cross_attn_audio_scale_shift.rows(timesteps, dtype)[0],
            cross_gate=self.av_cross_attn_audio_v2a_gate.rows(gate_timesteps, dtype)[0],
            cross_row_index=audio_row,  # the audio's cross modulation is always the item's timestep
            text_modulation=audio_text_mod,
            text_row_index=text_row if audio_text_mod is not None else None,
            rope=_cat_tables(audio_ropes, 0),
            cross_rope=_cat_tables(audio_ropes, 2),
            value_rows=value_rows[1],
        )
        video_text, audio_text = self._texts(items) if project_text else (None, None)
        num_cross = layout.num_cross_items
        inputs = BlockInputs(
            video=video_rows,
            audio=audio_rows,
            video_text=video_text,
            audio_text=audio_text,
            num_cross_video=sum(layout.video_counts[:num_cross]),
            num_cross_audio=sum(layout.audio_counts[:num_cross]),
            perturbed_blocks=frozenset(perturbed_blocks) if c.perturbed_attn else frozenset(),
        )
        return inputs, (video_embedded, video_row), (audio_embedded, audio_row)

    def _value_rows(
        self, items, layout: Layout, perturbed_blocks
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Per-token flags of the perturbed items (None when no item of the step is perturbed)."""
        if not (self.config.perturbed_attn and perturbed_blocks and any(item.perturbed for item in items)):
            return None, None
        video = [
            torch.full((g.num_video,), it.perturbed) for g, it in zip(layout.geometries, items, strict=True)
        ]
        audio = [
            torch.full((g.audio_frames,), it.perturbed)
            for g, it in zip(layout.geometries, items, strict=True)
        ]
        return to_device(torch.cat(video), self.device), to_device(torch.cat(audio), self.device)

    def _unpack(self, video: torch.Tensor, audio: torch.Tensor, layout: Layout):
        outputs: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(layout.order)
        video_parts = video.split(layout.video_counts)
        audio_parts = audio.split(layout.audio_counts)
        for position, geo in enumerate(layout.geometries):
            outputs[layout.order[position]] = (
                unpatchify_video(video_parts[position], geo.video_grid, self.config),
                unpatchify_audio(audio_parts[position], geo.audio_mel_bins),
            )
        return outputs


def _layer_text_kv(kvs: list[tuple[torch.Tensor, torch.Tensor]], index: int) -> tuple[torch.Tensor, ...]:
    """Layer `index` of every item's text keys and values side by side along the text tokens:
    video [2, T_text, Dv], audio [2, T_text, Da] (a layer at a time: no copy of the whole stack)."""
    if len(kvs) == 1:
        return kvs[0][0][index], kvs[0][1][index]
    return torch.cat([v[index] for v, _ in kvs], dim=1), torch.cat([a[index] for _, a in kvs], dim=1)


def _cat_tables(tables: list[tuple[torch.Tensor, ...]], first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate each item's (cos, sin) pair at position `first` along the tokens."""
    return torch.cat([t[first] for t in tables]), torch.cat([t[first + 1] for t in tables])
