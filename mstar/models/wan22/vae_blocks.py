"""Building blocks of the Wan VAE (2.1 and 2.2), plain PyTorch.

Attribute names follow diffusers' autoencoder_kl_wan.py so state-dict keys are identical.

Causal time handling: video is processed chunk by chunk (one latent frame per decoder call, 1 then
4 frames per encoder call). Every causal temporal conv prepends the last `CACHE_T` input frames of
the previous chunk (zeros before the first chunk), carried in a `FrameCache`. Zero tails are
numerically the same as diffusers' zero padding, so results match diffusers' feat_cache exactly,
and every chunk after the first sees the same shapes (one compiled graph for the steady state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

CACHE_T = 2  # frames a kernel-3 causal conv needs from the previous chunk


def frame_memory_format(x: torch.Tensor) -> torch.memory_format:
    """channels_last_3d when x [B, C, T, H, W] keeps channels innermost, else contiguous."""
    return torch.channels_last_3d if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def copy_frames(x: torch.Tensor) -> torch.Tensor:
    """A copy of x [B, C, T, H, W] with the canonical strides of its memory format.

    Why: a plain clone keeps a slice's strides, whose size-1 batch stride depends on the chunk
    length; torch.compile guards on it, so every chunk length / clip length would recompile.
    """
    return x.clone(memory_format=frame_memory_format(x))


def pin_frame_layout(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Under torch.compile, lay out x [B, C, T, H, W] channels-last when `like` is; else x itself.

    Why: inductor lays out a fresh buffer that feeds a 3D convolution (a residual sum) in the order
    that convolution takes for a contiguous input, channels-first; the conv then writes
    channels-first, and the channel norms after it read across channels (13 of the compiled decode's
    norm kernels at 480p; 391 vs 406-414 ms a decode on an H200 once pinned). Eager tensors already
    take their inputs' format, so outside a compile nothing changes.
    """
    if not torch.compiler.is_compiling() or frame_memory_format(like) is not torch.channels_last_3d:
        return x
    from torch._inductor import inductor_prims  # noqa: F401  (registers the prim below)

    _, c, t, h, w = x.shape
    return torch.ops.prims.inductor_force_stride_order(x, (c * t * h * w, 1, h * w * c, w * c, c))


class FrameCache:
    """Tail frames each causal conv hands from one chunk to the next, in call order.

    `previous` holds the tails written during the last chunk (None on the first chunk); each
    cached conv reads its slot, then writes its new tail to `tails`.
    """

    def __init__(self, previous: list[torch.Tensor] | None = None):
        self.previous = previous
        self.tails: list[torch.Tensor] = []

    @property
    def first_chunk(self) -> bool:
        return self.previous is None

    def read(self) -> torch.Tensor | None:
        if self.previous is None:
            return None
        return self.previous[len(self.tails)]

    def write(self, tail: torch.Tensor) -> None:
        self.tails.append(tail)


class CausalConv3d(nn.Conv3d):
    """Conv3d padded causally in time (all time padding in front) and symmetrically in space.

    Space is zero-padded by the conv itself (no padded copy of the activation); time by the
    previous chunk's tail frames, or zeros on the first chunk / without a cache.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        pad_t, pad_h, pad_w = self.padding
        self.time_pad = 2 * pad_t
        self.padding = (0, pad_h, pad_w)

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        # x: [B, C, T, H, W]
        if self.time_pad == 0:
            return super().forward(x)
        previous = None if cache is None else cache.read()
        if previous is None:
            x = F.pad(x, (0, 0, 0, 0, self.time_pad, 0))
        else:
            x = torch.cat([previous, x], dim=2)
        if cache is not None:
            cache.write(copy_frames(x[:, :, -self.time_pad :]))
        return super().forward(x)


class RMSNorm(nn.Module):
    """L2-normalise over channels (dim 1), times sqrt(dim) and a learned per-channel gain."""

    def __init__(self, dim: int, images: bool = True):
        super().__init__()
        broadcast_dims = (1, 1) if images else (1, 1, 1)
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *broadcast_dims))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, ...]
        return self._normalize(x, dim=1) * self.scale * self.gamma

    def forward_channels_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """The same norm over the last dim: x [..., C] (token layout)."""
        return self._normalize(x, dim=-1) * self.scale * self.gamma.flatten()

    @staticmethod
    def _normalize(x: torch.Tensor, dim: int) -> torch.Tensor:
        # Half precision normalises in fp32 like diffusers (the sum of squares overflows/rounds).
        x_norm = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return F.normalize(x_norm, dim=dim).to(x.dtype)


class Upsample2x(nn.Module):
    """Nearest-exact 2x spatial upsampling (a pure copy, so no fp32 round trip is needed)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2.0, mode="nearest-exact")


class Resample(nn.Module):
    """2x spatial resampling per frame, plus 2x causal temporal resampling for the *3d modes."""

    def __init__(self, dim: int, mode: str, upsample_out_dim: int | None = None):
        super().__init__()
        self.mode = mode
        upsample_out_dim = dim // 2 if upsample_out_dim is None else upsample_out_dim
        if mode in ("upsample2d", "upsample3d"):
            self.resample = nn.Sequential(Upsample2x(), nn.Conv2d(dim, upsample_out_dim, 3, padding=1))
        elif mode in ("downsample2d", "downsample3d"):
            self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=(2, 2)))
        else:
            raise ValueError(f"unknown resample mode '{mode}'")
        if mode == "upsample3d":
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=(0, 0, 0))

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        if self.mode == "upsample3d" and cache is not None:
            x = self._upsample_time(x, cache)
        b, c, t, h, w = x.shape
        x = x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)
        x = self.resample(x)
        x = x.reshape(b, t, x.shape[1], x.shape[2], x.shape[3]).permute(0, 2, 1, 3, 4)
        if self.mode == "downsample3d" and cache is not None:
            x = self._downsample_time(x, cache)
        return x

    def _upsample_time(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if cache.first_chunk:
            # The first latent frame decodes to one frame: no temporal doubling (diffusers' "Rep").
            zeros = torch.empty(
                b, c, CACHE_T, h, w, dtype=x.dtype, device=x.device, memory_format=frame_memory_format(x)
            )
            cache.write(zeros.zero_())  # the same strides as the later chunks' tails: one steady graph
            return x
        x = self.time_conv(x, cache)  # [B, 2C, T, H, W]: channel halves are the two output frames
        x = x.reshape(b, 2, c, t, h, w)
        x = torch.stack((x[:, 0], x[:, 1]), 3)  # [B, C, T, 2, H, W]
        return x.reshape(b, c, t * 2, h, w)

    def _downsample_time(self, x: torch.Tensor, cache: FrameCache) -> torch.Tensor:
        previous = cache.read()
        cache.write(copy_frames(x[:, :, -1:]))
        if previous is None:
            return x  # the first frame stands alone
        return self.time_conv(torch.cat([previous, x], dim=2))


class ResidualBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.norm1 = RMSNorm(in_dim, images=False)
        self.conv1 = CausalConv3d(in_dim, out_dim, 3, padding=1)
        self.norm2 = RMSNorm(out_dim, images=False)
        self.conv2 = CausalConv3d(out_dim, out_dim, 3, padding=1)
        self.conv_shortcut = CausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else nn.Identity()

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        shortcut = self.conv_shortcut(x)
        x = self.conv1(F.silu(self.norm1(x)), cache)
        x = self.conv2(F.silu(self.norm2(x)), cache)
        return pin_frame_layout(x + shortcut, like=x)


class AttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame.

    to_qkv and proj are 1x1 Conv2d (diffusers' keys) but run as matmuls on an explicit token
    layout [B*T, H*W, C]. Why: the 1x1 conv's output memory format follows stride heuristics
    (suggest_memory_format) that look at the stride of size-1 dims (B*T = 1 per chunk), where
    torch.compile's fake tensors and the real tensors disagree. The traced graph then believed the
    qkv tensor was already contiguous, dropped the .contiguous(), and handed SDPA (whose kernel is
    chosen at trace time from fake strides) differently strided real q/k/v: garbage frames. Matmul
    outputs are contiguous on every backend, so the compiled graph sees the strides eager does.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, C, T, H, W]
        identity = x
        b, c, t, h, w = x.shape
        tokens = x.permute(0, 2, 3, 4, 1).reshape(b * t, h * w, c)
        tokens = self.norm.forward_channels_last_dim(tokens)
        qkv = F.linear(tokens, self.to_qkv.weight.flatten(1), self.to_qkv.bias)  # [B*T, H*W, 3C]
        q, k, v = qkv.unsqueeze(1).chunk(3, dim=-1)  # each [B*T, 1, H*W, C]
        attended = F.scaled_dot_product_attention(q, k, v).squeeze(1)  # [B*T, H*W, C]
        x = F.linear(attended, self.proj.weight.flatten(1), self.proj.bias)
        x = x.reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)  # [B, C, T, H, W] (channels_last_3d)
        return x + identity


class MidBlock(nn.Module):
    def __init__(self, dim: int, num_layers: int = 1):
        super().__init__()
        self.attentions = nn.ModuleList([AttentionBlock(dim) for _ in range(num_layers)])
        self.resnets = nn.ModuleList([ResidualBlock(dim, dim) for _ in range(num_layers + 1)])

    def forward(self, x: torch.Tensor, cache: FrameCache | None = None) -> torch.Tensor:
        x = self.resnets[0](x, cache)
        for attention, resnet in zip(self.attentions, self.resnets[1:], strict=True):
            x = resnet(attention(x), cache)
        return x
