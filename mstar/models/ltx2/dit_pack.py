"""What one packed LTX-2 DiT forward is made of: per-item inputs, patchify and its inverse, the
host-side layout (token counts, timestep rows, token -> row maps) and the rotary tables.

Items are packed in an order where every item that runs audio-video cross attention comes before
the isolated ones (modality guidance), so that attention runs on a prefix of both streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mstar.diffusion.packing import bounded_cache_get
from mstar.models.ltx2 import rope
from mstar.models.ltx2.config import DiTConfig

MAX_CACHED_TABLES = 64  # rotary tables per geometry (sizes repeat every step)


@dataclass
class DiTInput:
    """One item of a packed forward (one request's guidance label).

    video_latents [C, F, H, W] and audio_latents [C, L, M]: the normalised latents the pipeline
    denoises (unpacked); timestep: sigma * 1000 (the scheduler's timestep); video_text
    [L_text, Cv] and audio_text [L_text, Ca]: the text connectors' outputs for this label's
    prompt (the tokens its mask keeps: all of them with learned registers); frame_rate: the
    conditioning frame rate (fps / motion speed) the video rotary is in; num_clean_frames: leading
    latent frames at timestep 0 (image-to-video's conditioning frame); isolated: no audio-video
    cross attention (modality guidance); perturbed: self attention skipped in the blocks the step
    names (spatio-temporal guidance, models with perturbed attention only); use_cross_timestep:
    the cross attention's modulation follows the other stream's timestep (LTX2Pipeline's default);
    text_kv: LTX2DiT.text_kv(video_text, audio_text), the text's cross-attention keys and values,
    kept by the caller across steps (computed in the forward when None).
    """

    video_latents: torch.Tensor
    audio_latents: torch.Tensor
    timestep: float
    video_text: torch.Tensor
    audio_text: torch.Tensor
    frame_rate: float = 24.0
    num_clean_frames: int = 0
    isolated: bool = False
    perturbed: bool = False
    use_cross_timestep: bool = True
    text_kv: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class ItemGeometry:
    """Token grid of one item: video (frames, height, width) in patches and audio frames."""

    video_grid: tuple[int, int, int]
    audio_frames: int
    audio_mel_bins: int
    text_tokens: int

    @property
    def num_video(self) -> int:
        frames, height, width = self.video_grid
        return frames * height * width


@dataclass
class Layout:
    """Host-side description of one packed forward (items in packing order)."""

    order: list[int]  # packing position -> caller's item index
    geometries: list[ItemGeometry]
    num_cross_items: int  # the first items run audio-video cross attention
    timesteps: torch.Tensor  # float32 [R] the distinct timesteps of the items (rows)
    video_row: torch.Tensor  # int64 [Tv] token -> row of its timestep
    video_cross_row: torch.Tensor  # int64 [Tv] token -> row of its cross attention modulation
    audio_row: torch.Tensor  # int64 [Ta]
    text_row: torch.Tensor  # int64 [T_text] (the same lengths for video and audio text)

    @property
    def video_counts(self) -> list[int]:
        return [g.num_video for g in self.geometries]

    @property
    def audio_counts(self) -> list[int]:
        return [g.audio_frames for g in self.geometries]

    @property
    def text_counts(self) -> list[int]:
        return [g.text_tokens for g in self.geometries]


def packing_order(items: list[DiTInput]) -> list[int]:
    """Items with audio-video cross attention first, each group in the caller's order."""
    return [i for i, item in enumerate(items) if not item.isolated] + [
        i for i, item in enumerate(items) if item.isolated
    ]


def item_geometry(item: DiTInput, config: DiTConfig) -> ItemGeometry:
    c = config
    if item.video_latents.dim() != 4 or item.video_latents.shape[0] != c.in_channels:
        raise ValueError(
            f"video_latents must be [{c.in_channels}, F, H, W], got {tuple(item.video_latents.shape)}"
        )
    if item.audio_latents.dim() != 3:
        raise ValueError(f"audio_latents must be [C, L, M], got {tuple(item.audio_latents.shape)}")
    channels, frames, mel_bins = item.audio_latents.shape
    if channels * mel_bins != c.audio_in_channels:
        raise ValueError(
            f"audio_latents [C, L, M] need C * M = {c.audio_in_channels}, got {channels} * {mel_bins}"
        )
    if item.video_text.shape[0] != item.audio_text.shape[0]:
        raise ValueError("video_text and audio_text must have the same number of tokens")
    _, f, h, w = item.video_latents.shape
    grid = (f // c.patch_size_t, h // c.patch_size, w // c.patch_size)
    return ItemGeometry(grid, frames, mel_bins, int(item.video_text.shape[0]))


def patchify_video(latents: torch.Tensor, config: DiTConfig) -> torch.Tensor:
    """[C, F, H, W] -> [F'*H'*W', C*pt*p*p] (LTX2Pipeline._pack_latents for one item)."""
    pt, p = config.patch_size_t, config.patch_size
    c, f, h, w = latents.shape
    x = latents.reshape(c, f // pt, pt, h // p, p, w // p, p)
    return x.permute(1, 3, 5, 0, 2, 4, 6).flatten(3, 6).flatten(0, 2)


def unpatchify_video(tokens: torch.Tensor, grid: tuple[int, int, int], config: DiTConfig) -> torch.Tensor:
    """[F'*H'*W', C*pt*p*p] -> [C, F, H, W] (LTX2Pipeline._unpack_latents for one item)."""
    pt, p = config.patch_size_t, config.patch_size
    frames, height, width = grid
    x = tokens.reshape(frames, height, width, -1, pt, p, p)
    x = x.permute(3, 0, 4, 1, 5, 2, 6)
    return x.reshape(x.shape[0], frames * pt, height * p, width * p)


def patchify_audio(latents: torch.Tensor) -> torch.Tensor:
    """[C, L, M] -> [L, C*M] (LTX2Pipeline._pack_audio_latents without patch sizes)."""
    return latents.transpose(0, 1).flatten(1, 2)


def unpatchify_audio(tokens: torch.Tensor, mel_bins: int) -> torch.Tensor:
    """[L, C*M] -> [C, L, M]."""
    return tokens.unflatten(1, (-1, mel_bins)).transpose(0, 1)


def build_layout(items: list[DiTInput], config: DiTConfig) -> Layout:
    order = packing_order(items)
    ordered = [items[i] for i in order]
    geometries = [item_geometry(item, config) for item in ordered]
    # One row per distinct timestep: a guided step's labels of one request share theirs, and a
    # row's modulation depends on its timestep alone (each row is computed alone, see
    # AdaLayerNormSingle.rows), so sharing it changes no output and computes it once.
    rows: dict[float, int] = {}

    def row_of(timestep: float) -> int:
        return rows.setdefault(float(timestep), len(rows))

    video_rows, cross_rows, audio_rows, text_rows = [], [], [], []
    for item, geo in zip(ordered, geometries, strict=True):
        row = row_of(item.timestep)
        video_row = torch.full((geo.num_video,), row, dtype=torch.int64)
        if item.num_clean_frames > 0:
            video_row[: item.num_clean_frames * geo.video_grid[1] * geo.video_grid[2]] = row_of(0.0)
        video_rows.append(video_row)
        # With use_cross_timestep the video's cross attention follows the audio timestep (the
        # item's); without, each video token's own timestep.
        cross_rows.append(torch.full_like(video_row, row) if item.use_cross_timestep else video_row)
        audio_rows.append(torch.full((geo.audio_frames,), row, dtype=torch.int64))
        text_rows.append(torch.full((geo.text_tokens,), row, dtype=torch.int64))
    return Layout(
        order=order,
        geometries=geometries,
        num_cross_items=sum(1 for item in ordered if not item.isolated),
        timesteps=torch.tensor(list(rows), dtype=torch.float32),
        video_row=torch.cat(video_rows),
        video_cross_row=torch.cat(cross_rows),
        audio_row=torch.cat(audio_rows),
        text_row=torch.cat(text_rows),
    )


class RopeCache:
    """Rotary tables of every item geometry, built on the host in float32 and kept on the device."""

    def __init__(self, config: DiTConfig):
        self.config = config
        self._cache: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def video(
        self, grid: tuple[int, int, int], frame_rate: float, device: torch.device
    ) -> tuple[torch.Tensor, ...]:
        """(self cos, self sin, cross cos, cross sin) of one video grid at a conditioning rate."""

        def build() -> tuple[torch.Tensor, ...]:
            c = self.config
            patch = (c.patch_size_t, c.patch_size, c.patch_size)
            latent = (grid[0] * c.patch_size_t, grid[1] * c.patch_size, grid[2] * c.patch_size)
            coords = rope.video_coords(*latent, frame_rate, patch, c.vae_scale_factors, c.causal_offset)
            max_positions = (c.pos_embed_max_pos, c.base_height, c.base_width)
            self_tables = rope.rope_tables(
                coords, c.inner_dim, max_positions, c.rope_theta, c.rope_double_precision, c.rope_type,
                c.num_attention_heads,
            )  # fmt: skip
            cross_tables = rope.rope_tables(
                coords[0:1], c.audio_cross_attention_dim, (self._cross_max_position(),), c.rope_theta,
                c.rope_double_precision, c.rope_type, c.num_attention_heads,
            )  # fmt: skip
            return tuple(t.to(device) for t in (*self_tables, *cross_tables))

        key = ("video", grid, float(frame_rate), str(device))
        return bounded_cache_get(self._cache, key, build, MAX_CACHED_TABLES)

    def audio(self, frames: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(self cos, self sin, cross cos, cross sin) of one audio length."""

        def build() -> tuple[torch.Tensor, ...]:
            c = self.config
            coords = rope.audio_coords(
                frames, c.audio_patch_size_t, c.audio_scale_factor, c.causal_offset, c.audio_hop_length,
                c.audio_sampling_rate,
            )  # fmt: skip
            self_tables = rope.rope_tables(
                coords, c.audio_inner_dim, (c.audio_pos_embed_max_pos,), c.rope_theta, c.rope_double_precision,
                c.rope_type, c.audio_num_attention_heads,
            )  # fmt: skip
            cross_tables = rope.rope_tables(
                coords, c.audio_cross_attention_dim, (self._cross_max_position(),), c.rope_theta,
                c.rope_double_precision, c.rope_type, c.audio_num_attention_heads,
            )  # fmt: skip
            return tuple(t.to(device) for t in (*self_tables, *cross_tables))

        return bounded_cache_get(self._cache, ("audio", frames, str(device)), build, MAX_CACHED_TABLES)

    def _cross_max_position(self) -> int:
        return max(self.config.pos_embed_max_pos, self.config.audio_pos_embed_max_pos)
