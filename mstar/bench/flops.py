"""Counted FLOPs of one DiT forward, and the roofline time they imply.

A GEMM of [M, K] x [K, N] costs 2*M*N*K FLOPs. Attention of Tq queries over Tkv keys with H heads of
size D costs 2*Tq*Tkv*H*D for QK^T plus the same for PV. Each packed segment attends only to itself
(ragged attention), so attention is summed per segment, never over the packed length.
Element-wise work (norms, rotary, modulation, softmax) is left out: it is bandwidth, not FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

# Measured on an H200: bf16 GEMM at DiT shapes (777-794 TFLOP/s) and fa3 varlen attention (664).
GEMM_CEILING_FLOPS = 780e12
ATTENTION_CEILING_FLOPS = 660e12
ZIMAGE_ADALN_DIM = 256  # diffusers' ADALN_EMBED_DIM
ZIMAGE_TIMESTEP_MID = 1024


@dataclass(frozen=True)
class DitArch:
    """The numbers of a DiT that set its FLOPs (read from a diffusers transformer config)."""

    family: str  # "wan" | "zimage"
    num_layers: int
    dim: int
    num_heads: int
    head_dim: int
    ffn_dim: int
    num_ffn_matrices: int  # 2 for GELU MLPs (Wan), 3 for SwiGLU (Z-Image)
    patch_features: int  # input features of one patch (channels * patch volume)
    out_patch_features: int
    text_dim: int  # text embedding width entering the DiT
    freq_dim: int = 256
    num_refiner_layers: int = 0  # Z-Image: noise and context refiners
    timestep_per_token: bool = False  # Wan2.2 TI2V embeds the timestep for every token


@dataclass(frozen=True)
class Segment:
    """One (request, label) in a packed forward: its latent tokens and its text tokens."""

    image_tokens: int
    text_tokens: int


@dataclass(frozen=True)
class FlopCount:
    gemm: float
    attention: float

    @property
    def total(self) -> float:
        return self.gemm + self.attention

    def roofline_s(
        self, gemm_ceiling: float = GEMM_CEILING_FLOPS, attention_ceiling: float = ATTENTION_CEILING_FLOPS
    ) -> float:
        """The shortest time this work could take on the GPU: each part at its measured ceiling."""
        return self.gemm / gemm_ceiling + self.attention / attention_ceiling

    def __add__(self, other: FlopCount) -> FlopCount:
        return FlopCount(self.gemm + other.gemm, self.attention + other.attention)


def gemm_flops(m: int, n: int, k: int) -> float:
    return 2.0 * m * n * k


def attention_flops(q_len: int, kv_len: int, num_heads: int, head_dim: int) -> float:
    return 2 * 2.0 * q_len * kv_len * num_heads * head_dim  # QK^T and PV


def wan_arch(config: dict) -> DitArch:
    """From a WanTransformer3DModel config (e.g. Wan2.2-TI2V-5B: 30 layers, 24 x 128, ffn 14336)."""
    patch_t, patch_h, patch_w = config.get("patch_size", (1, 2, 2))
    patch_volume = patch_t * patch_h * patch_w
    in_channels = config.get("in_channels", 16)
    out_channels = config.get("out_channels") or in_channels
    num_heads = config.get("num_attention_heads", 40)
    head_dim = config.get("attention_head_dim", 128)
    return DitArch(
        family="wan",
        num_layers=config.get("num_layers", 40),
        dim=num_heads * head_dim,
        num_heads=num_heads,
        head_dim=head_dim,
        ffn_dim=config.get("ffn_dim", 13824),
        num_ffn_matrices=2,
        patch_features=in_channels * patch_volume,
        out_patch_features=out_channels * patch_volume,
        text_dim=config.get("text_dim", 4096),
        freq_dim=config.get("freq_dim", 256),
        timestep_per_token=bool(config.get("timestep_per_token", False)),
    )


def zimage_arch(config: dict) -> DitArch:
    """From a ZImageTransformer2DModel config (Z-Image-Turbo: 30 layers, dim 3840, 30 heads)."""
    dim = config.get("dim", 3840)
    num_heads = config.get("n_heads", 30)
    patch = config.get("all_patch_size", (2,))[0]
    frame_patch = config.get("all_f_patch_size", (1,))[0]
    in_channels = config.get("in_channels", 16)
    patch_features = in_channels * patch * patch * frame_patch
    return DitArch(
        family="zimage",
        num_layers=config.get("n_layers", 30),
        dim=dim,
        num_heads=num_heads,
        head_dim=dim // num_heads,
        ffn_dim=int(dim / 3 * 8),
        num_ffn_matrices=3,
        patch_features=patch_features,
        out_patch_features=patch_features,
        text_dim=config.get("cap_feat_dim", 2560),
        num_refiner_layers=config.get("n_refiner_layers", 2),
    )


def _self_block(arch: DitArch, num_tokens: int) -> FlopCount:
    """QKV + out projections, self attention, FFN over one segment of `num_tokens`."""
    dim = arch.dim
    projections = 4 * gemm_flops(num_tokens, dim, dim)
    ffn = arch.num_ffn_matrices * gemm_flops(num_tokens, arch.ffn_dim, dim)
    attention = attention_flops(num_tokens, num_tokens, arch.num_heads, arch.head_dim)
    return FlopCount(projections + ffn, attention)


def _cross_block(arch: DitArch, segment: Segment) -> FlopCount:
    """Wan cross attention: Q/out on latent tokens, K/V on text tokens, then attention."""
    dim = arch.dim
    projections = 2 * gemm_flops(segment.image_tokens, dim, dim) + 2 * gemm_flops(
        segment.text_tokens, dim, dim
    )
    attention = attention_flops(segment.image_tokens, segment.text_tokens, arch.num_heads, arch.head_dim)
    return FlopCount(projections, attention)


def _wan_segment(arch: DitArch, segment: Segment) -> FlopCount:
    dim, tokens = arch.dim, segment.image_tokens
    per_layer = _self_block(arch, tokens) + _cross_block(arch, segment)
    timestep_rows = tokens if arch.timestep_per_token else 1
    embed = (
        gemm_flops(tokens, dim, arch.patch_features)  # patch embedding (a strided conv = a GEMM)
        + gemm_flops(segment.text_tokens, dim, arch.text_dim)  # text projection, 2 layers
        + gemm_flops(segment.text_tokens, dim, dim)
        + gemm_flops(timestep_rows, dim, arch.freq_dim)  # time embedder + 6-way modulation projection
        + gemm_flops(timestep_rows, dim, dim)
        + gemm_flops(timestep_rows, 6 * dim, dim)
        + gemm_flops(tokens, arch.out_patch_features, dim)  # proj_out
    )
    return FlopCount(per_layer.gemm * arch.num_layers + embed, per_layer.attention * arch.num_layers)


def _zimage_segment(arch: DitArch, segment: Segment) -> FlopCount:
    """Refiners run on image and caption tokens apart; the main layers on both joined."""
    dim = arch.dim
    image, text = segment.image_tokens, segment.text_tokens
    refiners = _self_block(arch, image) + _self_block(arch, text)
    main = _self_block(arch, image + text)
    embed = (
        gemm_flops(image, dim, arch.patch_features)
        + gemm_flops(text, dim, arch.text_dim)
        + gemm_flops(image + text, arch.out_patch_features, dim)
    )
    # Per item, not per token: timestep MLP (freq -> 1024 -> adaLN width), each modulated block's
    # 4-way modulation (noise refiners and main layers) and the final layer's scale.
    adaln = min(dim, ZIMAGE_ADALN_DIM)
    conditioning = (
        gemm_flops(1, ZIMAGE_TIMESTEP_MID, arch.freq_dim)
        + gemm_flops(1, adaln, ZIMAGE_TIMESTEP_MID)
        + (arch.num_refiner_layers + arch.num_layers) * gemm_flops(1, 4 * dim, adaln)
        + gemm_flops(1, dim, adaln)
    )
    gemm = refiners.gemm * arch.num_refiner_layers + main.gemm * arch.num_layers + embed + conditioning
    attention = refiners.attention * arch.num_refiner_layers + main.attention * arch.num_layers
    return FlopCount(gemm, attention)


def count_forward(arch: DitArch, segments: list[Segment]) -> FlopCount:
    """FLOPs of one forward over `segments` packed together (batch 1 is one segment)."""
    per_segment = _wan_segment if arch.family == "wan" else _zimage_segment
    total = FlopCount(0.0, 0.0)
    for segment in segments:
        total = total + per_segment(arch, segment)
    return total


def wan_latent_tokens(width: int, height: int, num_frames: int, config: dict, vae_stride: int = 16) -> int:
    """Tokens of one Wan latent: VAE stride (16 for Wan2.2, 8 for 2.1) and temporal 4, then patches."""
    patch_t, patch_h, patch_w = config.get("patch_size", (1, 2, 2))
    latent_frames = (num_frames - 1) // 4 + 1
    return (latent_frames // patch_t) * (height // vae_stride // patch_h) * (width // vae_stride // patch_w)


def zimage_image_tokens(width: int, height: int, config: dict, vae_stride: int = 8) -> int:
    patch = config.get("all_patch_size", (2,))[0]
    return (height // vae_stride // patch) * (width // vae_stride // patch)


def pad_to_multiple(num_tokens: int, multiple: int = 32) -> int:
    """Z-Image pads image and caption sequences to a multiple of 32 tokens."""
    return num_tokens + (-num_tokens) % multiple
