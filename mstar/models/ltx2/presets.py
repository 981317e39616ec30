"""LTX-2 presets: the released checkpoint's configuration and tiny sizes for tests (sources in
config.py's docstring). No torch."""

from __future__ import annotations

from mstar.models.ltx2.config import (
    AudioVAEConfig,
    ConnectorsConfig,
    DiTConfig,
    LTX2Config,
    RequestDefaults,
    SchedulerConfig,
    VideoVAEConfig,
    VocoderConfig,
)

# The released LTX-2 (19B): convert_ltx2_to_diffusers.py "2.0" values where they differ from the
# constructors' defaults (the rest of that script's values equal the defaults).
LTX2 = LTX2Config(
    dit=DiTConfig(rope_type="split"),
    connectors=ConnectorsConfig(rope_type="split"),
    vae=VideoVAEConfig(decoder_causal=False, spatial_compression_ratio=32, temporal_compression_ratio=8),
    scheduler=SchedulerConfig(
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        shift_terminal=0.1,
    ),
)


# A two-layer Gemma 3 whose width and layer count fit the tiny connectors (caption_channels 24,
# text_proj_in_factor 3: embeddings plus two layers), passed to transformers.Gemma3Config.
TINY_GEMMA3 = {
    "text_config": {
        "vocab_size": 320,
        "hidden_size": 24,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "sliding_window": 8,
        "max_position_embeddings": 256,
        "query_pre_attn_scalar": 16,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "vision_config": {
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    },
    "mm_tokens_per_image": 4,
    "image_token_index": 319,
}

# A few-kilobyte LTX-2 for CPU tests: every switch of LTX-2 on, sizes a CPU runs in milliseconds.
TINY = LTX2Config(
    dit=DiTConfig(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=16,
        cross_attention_dim=32,
        audio_in_channels=8,
        audio_out_channels=8,
        audio_num_attention_heads=2,
        audio_attention_head_dim=8,
        audio_cross_attention_dim=16,
        num_layers=2,
        caption_channels=24,
        rope_type="split",
        rope_double_precision=True,
        vae_scale_factors=(4, 8, 8),
    ),
    connectors=ConnectorsConfig(
        caption_channels=24,
        text_proj_in_factor=3,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=12,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=12,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=32,
        rope_type="split",
    ),
    vae=VideoVAEConfig(
        latent_channels=8,
        block_out_channels=(8, 16),
        down_block_types=("LTX2VideoDownBlock3D",) * 2,
        decoder_block_out_channels=(8, 16),
        layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1),
        spatio_temporal_scaling=(True, True),
        decoder_spatio_temporal_scaling=(True, True),
        decoder_inject_noise=(False, False, False),
        downsample_type=("spatiotemporal", "spatiotemporal"),
        upsample_type=("spatiotemporal", "spatiotemporal"),
        upsample_residual=(True, True),
        upsample_factor=(2, 2),
        patch_size=2,
        decoder_causal=False,
    ),
    audio_vae=AudioVAEConfig(
        base_channels=8,
        ch_mult=(1, 2),
        num_res_blocks=1,
        resolution=32,
        latent_channels=2,
        mel_bins=16,
    ),
    vocoder=VocoderConfig(
        in_channels=32,
        hidden_channels=16,
        upsample_kernel_sizes=(20, 32),
        upsample_factors=(10, 16),  # 160 samples a 10 ms mel frame: 16 kHz, as long as the video
        resnet_kernel_sizes=(3,),
        resnet_dilations=((1, 3, 5),),
        output_sampling_rate=16000,
    ),
    scheduler=LTX2.scheduler,
    text_encoder=TINY_GEMMA3,
    defaults=RequestDefaults(
        height=64, width=64, num_frames=9, frame_rate=8.0, num_inference_steps=3, max_sequence_length=16
    ),
)
