"""LTX-2 shapes, token counts, guidance labels and step cost: the one place these formulas live.

Torch-free: the spec (request limits), the nodes, the benchmark and the FLOP counter all read them.
Every formula is LTX2Pipeline's (diffusers 0.42.1):

    video latents  [C, (F - 1) // 8 + 1, H // 32, W // 32]            prepare_latents
    audio latents  [8, round(F / fps * 16000 / 160 / 4), 64 // 4]       prepare_audio_latents
    schedule mu    calculate_shift(video tokens, 1024, 4096, 0.95, 2.05)
    waveform       (4 * audio latent frames - 3) mel frames * 240 samples at 24 kHz
"""

from __future__ import annotations

from dataclasses import dataclass

from mstar.models.ltx2.config import (
    AudioVAEConfig,
    DiTConfig,
    LTX2Config,
    SchedulerConfig,
    VideoVAEConfig,
    VocoderConfig,
)

# Guidance labels: the DiT passes one denoise step of a request runs (each is a packed item).
COND = "cond"
UNCOND = "uncond"  # the negative prompt (classifier-free guidance)
PERTURBED = "perturbed"  # spatio-temporal guidance: self attention skipped in the chosen blocks
ISOLATED = "isolated"  # modality guidance: no audio-video cross attention

# Steps a terminal-shifted schedule needs: one sigma of 1 cannot be stretched to end at
# shift_terminal (the pipeline's sigmas are NaN).
MIN_STEPS = 2


@dataclass(frozen=True)
class VideoGeometry:
    """One request's video latents: frames, height and width in latent cells."""

    num_frames: int  # pixel frames
    frame_rate: float
    latent_frames: int
    latent_height: int
    latent_width: int
    channels: int

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        return (self.channels, self.latent_frames, self.latent_height, self.latent_width)

    @property
    def duration_s(self) -> float:
        return self.num_frames / self.frame_rate


@dataclass(frozen=True)
class AudioGeometry:
    """One request's audio latents and the waveform they decode to."""

    latent_frames: int
    latent_mel_bins: int
    channels: int
    mel_frames: int
    num_samples: int
    sample_rate: int

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.latent_frames, self.latent_mel_bins)

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate


def latent_frames(num_frames: int, vae: VideoVAEConfig) -> int:
    return (num_frames - 1) // vae.temporal_scale + 1


def decoded_frames(num_latent_frames: int, vae: VideoVAEConfig) -> int:
    """Pixel frames the video VAE decodes from `num_latent_frames` (the causal first frame is one)."""
    return (num_latent_frames - 1) * vae.temporal_scale + 1


def video_geometry(
    num_frames: int, height: int, width: int, frame_rate: float, config: LTX2Config
) -> VideoGeometry:
    vae = config.vae
    return VideoGeometry(
        num_frames=num_frames,
        frame_rate=float(frame_rate),
        latent_frames=latent_frames(num_frames, vae),
        latent_height=height // vae.spatial_scale,
        latent_width=width // vae.spatial_scale,
        channels=config.dit.in_channels,
    )


def num_video_tokens(video: VideoGeometry, dit: DiTConfig) -> int:
    return (
        (video.latent_frames // dit.patch_size_t)
        * (video.latent_height // dit.patch_size)
        * (video.latent_width // dit.patch_size)
    )


def audio_latents_per_second(audio_vae: AudioVAEConfig) -> float:
    return audio_vae.sample_rate / audio_vae.mel_hop_length / float(audio_vae.temporal_compression)


def audio_latent_frames(num_frames: int, frame_rate: float, audio_vae: AudioVAEConfig) -> int:
    """round(duration * latents per second), as the pipeline sizes the audio to the video."""
    return round(num_frames / frame_rate * audio_latents_per_second(audio_vae))


def decoded_mel_frames(num_latent_frames: int, audio_vae: AudioVAEConfig) -> int:
    """Mel frames the audio VAE decodes to (causal: the first latent frame gives one)."""
    target = num_latent_frames * audio_vae.temporal_compression
    if audio_vae.causality_axis is not None:
        target = max(target - (audio_vae.temporal_compression - 1), 1)
    return target


def audio_geometry(num_frames: int, frame_rate: float, config: LTX2Config) -> AudioGeometry:
    audio_vae, vocoder = config.audio_vae, config.vocoder
    frames = audio_latent_frames(num_frames, frame_rate, audio_vae)
    mel_frames = decoded_mel_frames(frames, audio_vae)
    return AudioGeometry(
        latent_frames=frames,
        latent_mel_bins=audio_vae.latent_mel_bins,
        channels=audio_vae.latent_channels,
        mel_frames=mel_frames,
        num_samples=mel_frames * vocoder.samples_per_mel_frame,
        sample_rate=vocoder.output_sampling_rate,
    )


def num_audio_tokens(audio: AudioGeometry) -> int:
    """The pipeline packs audio latents [C, L, M] as L tokens of C * M features."""
    return audio.latent_frames


def muxed_audio_samples(num_frames: int, frame_rate: float, vocoder: VocoderConfig) -> int:
    """Samples of an audio track exactly as long as the video (the decoded waveform is padded or
    cut to this before muxing; it is within 4 mel frames of it)."""
    return round(num_frames * vocoder.output_sampling_rate / frame_rate)


def schedule_mu(num_tokens: int, scheduler: SchedulerConfig) -> float:
    """calculate_shift with the scheduler's bounds: the exponential time shift of the sigmas."""
    slope = (scheduler.max_shift - scheduler.base_shift) / (
        scheduler.max_image_seq_len - scheduler.base_image_seq_len
    )
    intercept = scheduler.base_shift - slope * scheduler.base_image_seq_len
    return num_tokens * slope + intercept


def guidance_labels(
    guidance_scale: float,
    audio_guidance_scale: float,
    stg_scale: float,
    audio_stg_scale: float,
    modality_scale: float,
    audio_modality_scale: float,
    stg_blocks: tuple[int, ...],
    dit: DiTConfig,
) -> tuple[str, ...]:
    """The passes one step of a request runs, in LTX2Pipeline's rules (scales already resolved:
    the pipeline's audio scales fall back to the video ones with `or`).

    The perturbed pass only differs from `cond` when the transformer has perturbed attention
    (`perturbed_attn`, LTX-2.3): LTX-2's blocks ignore the perturbation, the pipeline's extra pass
    equals `cond` and its guidance term is zero, so it is not run here."""
    labels = [COND]
    if guidance_scale > 1.0 or audio_guidance_scale > 1.0:
        labels.append(UNCOND)
    if (stg_scale > 0.0 or audio_stg_scale > 0.0) and stg_blocks and dit.perturbed_attn:
        labels.append(PERTURBED)
    if modality_scale > 1.0 or audio_modality_scale > 1.0:
        labels.append(ISOLATED)
    return tuple(labels)


@dataclass(frozen=True)
class LTX2Geometry:
    """The guidance rule at a config's request defaults (the spec's `geometry`): the scales not
    given are LTX2Pipeline's defaults."""

    config: LTX2Config

    def labels(
        self,
        guidance_scale: float,
        audio_guidance_scale: float | None = None,
        stg_scale: float | None = None,
        audio_stg_scale: float | None = None,
        modality_scale: float | None = None,
        audio_modality_scale: float | None = None,
    ) -> tuple[str, ...]:
        d = self.config.defaults

        def given(value: float | None, default: float) -> float:
            return default if value is None else value

        return guidance_labels(
            guidance_scale,
            given(audio_guidance_scale, d.audio_guidance_scale),
            given(stg_scale, d.stg_scale),
            given(audio_stg_scale, d.audio_stg_scale),
            given(modality_scale, d.modality_scale),
            given(audio_modality_scale, d.audio_modality_scale),
            d.spatio_temporal_guidance_blocks,
            self.config.dit,
        )


def step_tokens(num_video: int, num_audio: int, num_labels: int) -> int:
    """Tokens a request adds to one packed DiT step (every label is a segment of both streams)."""
    return (num_video + num_audio) * num_labels


def forward_flops(
    dit: DiTConfig, num_video: int, num_audio: int, num_text: int, cross_modal: bool = True
) -> tuple[float, float]:
    """(GEMM FLOPs, attention FLOPs) of one item through the DiT: 2*M*N*K per GEMM, 4*Tq*Tkv*H*D
    per attention. Text tokens enter the video and audio text cross attention; element-wise work
    (norms, rotary, modulation) is bandwidth and left out."""
    video, audio = dit.inner_dim, dit.audio_inner_dim
    cross = dit.audio_cross_attention_dim  # the a2v / v2a attention width

    def gemm(m: int, n: int, k: int) -> float:
        return 2.0 * m * n * k

    def attention(q: int, kv: int, heads: int, head_dim: int) -> float:
        return 4.0 * q * kv * heads * head_dim

    per_layer = (
        4 * gemm(num_video, video, video)  # video self attention q, k, v, out
        + 4 * gemm(num_audio, audio, audio)
        + 2 * gemm(num_video, video, video) + 2 * gemm(num_text, video, dit.cross_attention_dim)
        + 2 * gemm(num_audio, audio, audio) + 2 * gemm(num_text, audio, dit.audio_cross_attention_dim)
        + 2 * gemm(num_video, 4 * video, video)  # FFN: dim -> 4 dim -> dim
        + 2 * gemm(num_audio, 4 * audio, audio)
    )  # fmt: skip
    attn = (
        attention(num_video, num_video, dit.num_attention_heads, dit.attention_head_dim)
        + attention(num_audio, num_audio, dit.audio_num_attention_heads, dit.audio_attention_head_dim)
        + attention(num_video, num_text, dit.num_attention_heads, dit.attention_head_dim)
        + attention(num_audio, num_text, dit.audio_num_attention_heads, dit.audio_attention_head_dim)
    )
    if cross_modal:
        heads, head_dim = dit.audio_num_attention_heads, dit.audio_attention_head_dim
        per_layer += gemm(num_video, cross, video) * 2 + gemm(num_audio, cross, audio) * 2  # a2v q/out, k/v
        per_layer += gemm(num_audio, cross, audio) * 2 + gemm(num_video, cross, video) * 2  # v2a
        attn += 2 * attention(num_video, num_audio, heads, head_dim)
    embed = (
        gemm(num_video, video, dit.in_channels * dit.patch_size_t * dit.patch_size**2)
        + gemm(num_audio, audio, dit.audio_in_channels)
        + gemm(num_video, dit.video_out_channels, video)
        + gemm(num_audio, dit.audio_output_channels, audio)
    )
    if dit.use_prompt_embeddings:
        embed += gemm(num_text, video, dit.caption_channels) + gemm(num_text, video, video)
        embed += gemm(num_text, audio, dit.caption_channels) + gemm(num_text, audio, audio)
    return per_layer * dit.num_layers + embed, attn * dit.num_layers


def frames_are_valid(num_frames: int, vae: VideoVAEConfig) -> bool:
    """Frame counts the VAE decodes exactly: 8k + 1 for LTX-2 (others are floored to one)."""
    return num_frames >= 1 and (num_frames - 1) % vae.temporal_scale == 0


__all__ = [
    "COND",
    "ISOLATED",
    "PERTURBED",
    "UNCOND",
    "AudioGeometry",
    "VideoGeometry",
    "audio_geometry",
    "audio_latent_frames",
    "decoded_frames",
    "decoded_mel_frames",
    "forward_flops",
    "frames_are_valid",
    "guidance_labels",
    "latent_frames",
    "muxed_audio_samples",
    "num_audio_tokens",
    "num_video_tokens",
    "schedule_mu",
    "step_tokens",
    "video_geometry",
]
