"""LTX-2 component configs: frozen dataclasses whose fields and defaults are diffusers 0.42.1's
constructor arguments (so a config.json that omits a key reads as diffusers reads it), the released
LTX-2 checkpoint as a preset, and tiny sizes for tests. No torch: the spec and geometry import this.

Where the LTX-2 values come from: diffusers' scripts/convert_ltx2_to_diffusers.py, version "2.0",
the script that wrote the diffusers folders of Lightricks/LTX-2 (transformer, connectors, vae,
audio_vae, vocoder and the FlowMatchEulerDiscreteScheduler it saves with the pipeline). The Gemma 3
text encoder is google/gemma-3-12b-it (the script's --text_encoder_model_id); its config.json as
sglang's LTX-2 model overlay writes it for that checkpoint. Request defaults are LTX2Pipeline's.

LTX-2.5 is in diffusers 0.42.1 only as Lightricks/LTX-2.5-Diffusers behind LTX2DFRPipeline (a
Gemma 4 text encoder, a duration head, a bandwidth-extending vocoder): no preset here. The DiT and
the connectors do read the LTX-2.3/2.5 switches (gated attention, cross-attention modulation,
per-modality text projections, static prompt modulation), so such a transformer folder loads.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DiTConfig:
    """diffusers LTX2VideoTransformer3DModel config.json."""

    in_channels: int = 128
    out_channels: int | None = 128
    patch_size: int = 1
    patch_size_t: int = 1
    num_attention_heads: int = 32
    attention_head_dim: int = 128
    cross_attention_dim: int = 4096
    vae_scale_factors: tuple[int, int, int] = (8, 32, 32)
    pos_embed_max_pos: int = 20
    base_height: int = 2048
    base_width: int = 2048
    gated_attn: bool = False
    cross_attn_mod: bool = False
    audio_in_channels: int = 128
    audio_out_channels: int | None = 128
    audio_patch_size: int = 1
    audio_patch_size_t: int = 1
    audio_num_attention_heads: int = 32
    audio_attention_head_dim: int = 64
    audio_cross_attention_dim: int = 2048
    audio_scale_factor: int = 4
    audio_pos_embed_max_pos: int = 20
    audio_sampling_rate: int = 16000
    audio_hop_length: int = 160
    audio_gated_attn: bool = False
    audio_cross_attn_mod: bool = False
    num_layers: int = 48
    activation_fn: str = "gelu-approximate"
    qk_norm: str = "rms_norm_across_heads"
    norm_elementwise_affine: bool = False
    norm_eps: float = 1e-6
    caption_channels: int = 3840
    attention_bias: bool = True
    attention_out_bias: bool = True
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    causal_offset: int = 1
    timestep_scale_multiplier: int = 1000
    cross_attn_timestep_scale_multiplier: int = 1000
    rope_type: str = "interleaved"
    use_prompt_embeddings: bool = True
    perturbed_attn: bool = False
    ff_bias: bool = True
    audio_ff_bias: bool = True
    use_prompt_adaln_single: bool = True
    use_keyframes_abs_pos_embedding: bool = False

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def audio_inner_dim(self) -> int:
        return self.audio_num_attention_heads * self.audio_attention_head_dim

    @property
    def video_out_channels(self) -> int:
        return self.out_channels or self.in_channels

    @property
    def audio_output_channels(self) -> int:
        return self.audio_out_channels or self.audio_in_channels

    @property
    def prompt_modulation(self) -> bool:
        """LTX-2.3's cross-attention modulation of the text keys/values (either stream)."""
        return self.cross_attn_mod or self.audio_cross_attn_mod


@dataclass(frozen=True)
class ConnectorsConfig:
    """diffusers LTX2TextConnectors config.json (the text path between Gemma 3 and the DiT)."""

    caption_channels: int = 3840
    text_proj_in_factor: int = 49
    video_connector_num_attention_heads: int = 30
    video_connector_attention_head_dim: int = 128
    video_connector_num_layers: int = 2
    video_connector_num_learnable_registers: int | None = 128
    video_gated_attn: bool = False
    audio_connector_num_attention_heads: int = 30
    audio_connector_attention_head_dim: int = 128
    audio_connector_num_layers: int = 2
    audio_connector_num_learnable_registers: int | None = 128
    audio_gated_attn: bool = False
    connector_rope_base_seq_len: int = 4096
    rope_theta: float = 10000.0
    rope_double_precision: bool = True
    causal_temporal_positioning: bool = False
    rope_type: str = "interleaved"
    per_modality_projections: bool = False
    video_hidden_dim: int = 4096
    audio_hidden_dim: int = 2048
    proj_bias: bool = False

    @property
    def video_dim(self) -> int:
        """Width of the video text embedding the connectors give the DiT."""
        return self.video_connector_num_attention_heads * self.video_connector_attention_head_dim

    @property
    def audio_dim(self) -> int:
        return self.audio_connector_num_attention_heads * self.audio_connector_attention_head_dim


@dataclass(frozen=True)
class VideoVAEConfig:
    """diffusers AutoencoderKLLTX2Video config.json."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 128
    block_out_channels: tuple[int, ...] = (256, 512, 1024, 2048)
    down_block_types: tuple[str, ...] = ("LTX2VideoDownBlock3D",) * 4
    decoder_block_out_channels: tuple[int, ...] = (256, 512, 1024)
    layers_per_block: tuple[int, ...] = (4, 6, 6, 2, 2)
    decoder_layers_per_block: tuple[int, ...] = (5, 5, 5, 5)
    spatio_temporal_scaling: tuple[bool, ...] = (True, True, True, True)
    decoder_spatio_temporal_scaling: tuple[bool, ...] = (True, True, True)
    decoder_inject_noise: tuple[bool, ...] = (False, False, False, False)
    downsample_type: tuple[str, ...] = ("spatial", "temporal", "spatiotemporal", "spatiotemporal")
    upsample_type: tuple[str, ...] = ("spatiotemporal", "spatiotemporal", "spatiotemporal")
    upsample_residual: tuple[bool, ...] = (True, True, True)
    upsample_factor: tuple[int, ...] = (2, 2, 2)
    timestep_conditioning: bool = False
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    scaling_factor: float = 1.0
    encoder_causal: bool = True
    decoder_causal: bool = True
    encoder_spatial_padding_mode: str = "zeros"
    decoder_spatial_padding_mode: str = "reflect"
    spatial_compression_ratio: int | None = None
    temporal_compression_ratio: int | None = None

    @property
    def spatial_scale(self) -> int:
        """Pixels per latent cell along a side (diffusers' spatial_compression_ratio)."""
        if self.spatial_compression_ratio is not None:
            return self.spatial_compression_ratio
        return self.patch_size * 2 ** sum(self.spatio_temporal_scaling)

    @property
    def temporal_scale(self) -> int:
        if self.temporal_compression_ratio is not None:
            return self.temporal_compression_ratio
        return self.patch_size_t * 2 ** sum(self.spatio_temporal_scaling)


@dataclass(frozen=True)
class AudioVAEConfig:
    """diffusers AutoencoderKLLTX2Audio config.json (mel spectrogram <-> audio latents)."""

    base_channels: int = 128
    output_channels: int = 2
    ch_mult: tuple[int, ...] = (1, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] | None = None
    in_channels: int = 2
    resolution: int = 256
    latent_channels: int = 8
    norm_type: str = "pixel"
    causality_axis: str | None = "height"
    dropout: float = 0.0
    mid_block_add_attention: bool = False
    sample_rate: int = 16000
    mel_hop_length: int = 160
    is_causal: bool = True
    mel_bins: int | None = 64
    double_z: bool = True

    # Fixed in diffusers (LATENT_DOWNSAMPLE_FACTOR), not in the config: mel frames and mel bins per
    # latent cell.
    temporal_compression: int = field(default=4, init=False)
    mel_compression: int = field(default=4, init=False)

    @property
    def latent_mel_bins(self) -> int:
        return (self.mel_bins or 64) // self.mel_compression


@dataclass(frozen=True)
class VocoderConfig:
    """diffusers LTX2Vocoder config.json (mel spectrogram -> waveform)."""

    in_channels: int = 128
    hidden_channels: int = 1024
    out_channels: int = 2
    upsample_kernel_sizes: tuple[int, ...] = (16, 15, 8, 4, 4)
    upsample_factors: tuple[int, ...] = (6, 5, 2, 2, 2)
    resnet_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resnet_dilations: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    act_fn: str = "leaky_relu"
    leaky_relu_negative_slope: float = 0.1
    antialias: bool = False
    antialias_ratio: int = 2
    antialias_kernel_size: int = 12
    final_act_fn: str | None = "tanh"
    final_bias: bool = True
    output_sampling_rate: int = 24000

    @property
    def samples_per_mel_frame(self) -> int:
        total = 1
        for factor in self.upsample_factors:
            total *= factor
        return total


@dataclass(frozen=True)
class SchedulerConfig:
    """The FlowMatchEulerDiscreteScheduler fields LTX2Pipeline's schedule reads."""

    num_train_timesteps: int = 1000
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    shift_terminal: float | None = None
    time_shift_type: str = "exponential"


# google/gemma-3-12b-it, passed to transformers.Gemma3Config (text_encoder/config.json).
GEMMA3_12B: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "max_position_embeddings": 131072,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-6,
        "rope_local_base_freq": 10000,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
    },
    "vision_config": {
        "attention_dropout": 0.0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "layer_norm_eps": 1e-6,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


@dataclass(frozen=True)
class RequestDefaults:
    """LTX2Pipeline.__call__'s defaults (LTX2ImageToVideoPipeline has the same ones)."""

    height: int = 512
    width: int = 768
    num_frames: int = 121
    frame_rate: float = 24.0
    num_inference_steps: int = 30
    guidance_scale: float = 3.0
    stg_scale: float = 1.0
    modality_scale: float = 3.0
    guidance_rescale: float = 0.7
    audio_guidance_scale: float = 7.0
    audio_stg_scale: float = 1.0
    audio_modality_scale: float = 3.0
    audio_guidance_rescale: float = 0.7
    spatio_temporal_guidance_blocks: tuple[int, ...] = (28,)
    use_cross_timestep: bool = True
    decode_timestep: float = 0.0
    image_crf: int = 33  # utils.DEFAULT_IMAGE_CRF: what a Gemma 3 (LTX-2) text encoder implies
    max_sequence_length: int = 1024
    size_multiple: int = 32  # check_inputs: height and width divisible by 32


@dataclass(frozen=True)
class LTX2Config:
    dit: DiTConfig = field(default_factory=DiTConfig)
    connectors: ConnectorsConfig = field(default_factory=ConnectorsConfig)
    vae: VideoVAEConfig = field(default_factory=VideoVAEConfig)
    audio_vae: AudioVAEConfig = field(default_factory=AudioVAEConfig)
    vocoder: VocoderConfig = field(default_factory=VocoderConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    text_encoder: dict[str, Any] = field(default_factory=lambda: json.loads(json.dumps(GEMMA3_12B)))
    defaults: RequestDefaults = field(default_factory=RequestDefaults)


def from_json_dict(cls: type, data: dict[str, Any]) -> Any:
    """A config dataclass from a diffusers config.json dict; unknown keys (`_class_name`,
    `_diffusers_version`, another version's fields) are ignored, lists become tuples."""
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {key: _tuples(value) for key, value in data.items() if key in known}
    return cls(**values)


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(item) for item in value)
    return value


def to_json_dict(config: Any) -> dict[str, Any]:
    """The diffusers-shaped config.json dict (tuples as lists), constructor fields only."""
    return {f.name: _lists(getattr(config, f.name)) for f in dataclasses.fields(config) if f.init}


def _lists(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_lists(item) for item in value]
    return value


def read_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))
