"""Serving-side VAE decode: channels_last_3d, optional torch.compile, uint8 frames on device.

Works with any causal chunked video decoder shaped like mstar.models.wan22.vae.WanVAEDecoder
(`ChunkDecoder` below). Two paths, both exposed so their speed can be measured:

- plain: the eager `decoder.decode(latents)` (the reference numerics), then uint8 conversion.
- fast: the same causal chunk loop, one latent frame per step, with the decoder's conv weights and
  activations in channels_last_3d (cuDNN's fast NDHWC kernels) and the step optionally compiled.
  The step ends with unpatchify + ((x.clamp(-1, 1) + 1) * 127.5).round() -> uint8 [f, H, W, 3],
  written into one preallocated uint8 buffer, so only uint8 ever leaves the GPU.

`path="auto"` takes the fast path for clips and the plain one for single images (one latent frame:
nothing to amortise a compile over). `iter_host_uint8` hands the frames to the host chunk by
chunk, as each is decoded, so a caller can encode the first frames while the rest decode.

Compile modes are mstar.engine.compile's: "off" | "deterministic" | "default" | "max-autotune".
"deterministic" is inductor with no timing-based choices (max_autotune and coordinate-descent
tuning off, `inductor.config.deterministic` where this torch has it), so every worker runs the same
kernels; convolutions stay on cuDNN's heuristic algorithm choice (torch.backends.cudnn.benchmark
stays off). Shapes are compiled static (`dynamic=False`): the first chunk and the steady-state
chunks are two graphs per resolution (chunk inputs and frame tails carry canonical strides, so
every clip length reuses them). Inductor's comprehensive padding is off for the VAE
(VAE_INDUCTOR_OPTIONS). On CPU compiling is turned off.

What serves requests (`decode_uint8`, `iter_host_uint8`) never waits for a compile: a resolution is
decoded on the compiled step only once `verify_fast_path` compiled and checked it against the plain
decode (>= 40 dB PSNR; mstar.engine.checked_compile.CheckedCompile). Warmup does that inline for
the configured sizes; any other resolution decodes on the eager step at once while its check runs
in the background, and stays eager if the compiled frames disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

from mstar.engine.checked_compile import CheckedCompile, uint8_psnr_db

logger = logging.getLogger(__name__)

DecodePath = Literal["auto", "plain", "fast"]

# Inductor's comprehensive padding (GPU only) pads the strides of contiguous intermediates to
# 128 bytes. In torch 2.11 a Conv3d decoder whose upsampled H*W stride is misaligned then reads a
# channels_last buffer with the padded contiguous stride: silently wrong, nondeterministic output
# (pytorch/pytorch#194281, fixed after 2.11). Wan2.2 at 480x832 has such strides (the 60x104 stage:
# 6240 elements) and a channel-shuffle shortcut (DupUp3D) like that repro. The decoder's hot
# tensors are channels_last (never padded) and convolutions dislike padding, so little is lost.
VAE_INDUCTOR_OPTIONS = {"comprehensive_padding": False}


class ChunkDecoder(Protocol):
    post_quant_conv: nn.Module

    def decode(self, latents: torch.Tensor) -> torch.Tensor: ...

    def decode_chunk(
        self, x: torch.Tensor, previous_tails: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]: ...

    def to_video(self, frames: torch.Tensor) -> torch.Tensor: ...

    def parameters(self) -> Any: ...

    def modules(self) -> Any: ...


def chunk_bounds(num_latent_frames: int, chunk_latent_frames: int = 1) -> list[tuple[int, int]]:
    """Latent frame ranges decoded per step: frame 0 alone (it decodes to one frame), then chunks.

    Every causal layer is exact over any split of the later frames, so chunk_latent_frames > 1
    gives the same video (up to float summation order) with fewer, larger steps; a last shorter
    chunk is one more compiled graph.
    """
    later = range(1, num_latent_frames, chunk_latent_frames)
    return [(0, 1)] + [(start, min(start + chunk_latent_frames, num_latent_frames)) for start in later]


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """Video [B, 3, F, H, W] in [-1, 1] -> uint8 [B, F, H, W, 3] on the same device."""
    import torch

    # fp32 arithmetic: bf16 has a step of 1.0 between 128 and 256, which would bias the rounding.
    pixels = ((video.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
    return pixels.permute(0, 2, 3, 4, 1)


def convert_to_channels_last(module: nn.Module) -> nn.Module:
    """Conv3d weights to channels_last_3d and Conv2d weights to channels_last, in place."""
    import torch
    from torch import nn

    for layer in module.modules():
        if isinstance(layer, nn.Conv3d):
            layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last_3d)
        elif isinstance(layer, nn.Conv2d):
            layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last)
    return module


class VaeDecodeRunner:
    """Decodes one clip's latents into uint8 frames on the decoder's device.

        runner = VaeDecodeRunner(decoder, compile_mode="deterministic")  # decoder on cuda, bf16
        frames = runner.decode_uint8(latents)   # [48, F', H', W'] or [1, 48, ...] -> uint8 [F, H, W, 3]
        frames_cpu = frames.cpu().numpy()

    `chunk_latent_frames`: latent frames per step after the first (1 = diffusers' schedule; larger
    keeps the GPU busier in the low-resolution stages at the cost of activation memory).
    `compile_backend` replaces inductor (e.g. "aot_eager" in CPU tests of the compile plumbing).
    `compiler`: where resolutions not warmed up compile (the process's compile thread by default).
    """

    def __init__(
        self,
        decoder: ChunkDecoder,
        compile_mode: str = "off",
        channels_last: bool = True,
        compile_backend: Any = None,
        dynamic: bool = False,
        chunk_latent_frames: int = 1,
        compiler: Any = None,
    ):
        from mstar.engine.compile import effective_mode

        self.decoder = decoder
        self.channels_last = channels_last
        if chunk_latent_frames < 1:
            raise ValueError(f"chunk_latent_frames must be >= 1, got {chunk_latent_frames}")
        self.chunk_latent_frames = chunk_latent_frames
        first_param = next(iter(decoder.parameters()))
        self.device = first_param.device
        self.dtype = first_param.dtype
        self.compile_mode = effective_mode(compile_mode, str(self.device))
        if compile_backend is not None and self.compile_mode == "off":
            self.compile_mode = "default"  # the backend replaces inductor; its options are unused
        if channels_last:
            convert_to_channels_last(decoder)  # type: ignore[arg-type]
        self._uint8_step = self._wrap(self._step_uint8, "vae_decode_uint8", compile_backend, dynamic)
        self._video_step = self._wrap(self._step_video, "vae_decode_video", compile_backend, dynamic)
        self.checked = CheckedCompile(
            "vae_decode_uint8", self._check_shape, enabled=self.compile_mode != "off", compiler=compiler
        )

    def _wrap(self, fn, name: str, compile_backend: Any, dynamic: bool):
        from mstar.engine.compile import CompiledFunction

        return CompiledFunction(
            fn, self.compile_mode, name, dynamic=dynamic, extra_options=VAE_INDUCTOR_OPTIONS,
            backend=compile_backend,
        )  # fmt: skip

    # -- public API -------------------------------------------------------------------------------

    def decode_uint8(self, latents: torch.Tensor, path: DecodePath = "auto") -> torch.Tensor:
        """Un-normalised latents of one clip -> uint8 frames [F, H, W, 3] on the device."""
        latents = self._as_clip(latents)
        if self.choose_path(latents.shape[2], path) == "plain":
            return self.decode_plain_uint8(latents)
        return self.decode_fast_uint8(latents, self._serving_step(latents))

    @staticmethod
    def choose_path(num_latent_frames: int, path: DecodePath = "auto") -> Literal["plain", "fast"]:
        if path not in ("auto", "plain", "fast"):
            raise ValueError(f"decode path must be auto, plain or fast, got '{path}'")
        if path == "auto":
            return "fast" if num_latent_frames > 1 else "plain"
        return path

    def decode_plain_uint8(self, latents: torch.Tensor) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            video = self.decoder.decode(self._as_clip(latents).to(self.device, self.dtype))
            return to_uint8_frames(video)[0]

    def decode_fast_uint8(self, latents: torch.Tensor, step=None) -> torch.Tensor:
        """The fast path on the compiled step (compiling it now if need be), or on `step`."""
        import torch

        with torch.inference_mode():
            chunks = list(self._run_chunks(self._as_clip(latents), step or self._uint8_step))
            return torch.cat(chunks, dim=0)  # [F, H, W, 3]

    def iter_host_uint8(self, latents: torch.Tensor, path: DecodePath = "auto") -> Iterator[torch.Tensor]:
        """`decode_uint8`'s frames in pieces on the host, each as soon as its chunk is decoded:
        uint8 [f, H, W, 3] CPU tensors whose concatenation is decode_uint8's output (the plain path
        gives one piece). Call under torch.inference_mode(). Each piece's copy to the host is
        queued right behind its chunk and waited for only after the next chunk is queued, so the
        device keeps decoding while the caller passes a piece on."""
        latents = self._as_clip(latents)
        if self.choose_path(latents.shape[2], path) == "plain":
            yield self.decode_plain_uint8(latents).cpu()
            return
        pending = None
        for frames in self._run_chunks(latents, self._serving_step(latents)):
            copy = _start_host_copy(frames)
            if pending is not None:
                yield _finish_host_copy(pending)
            pending = copy
        if pending is not None:
            yield _finish_host_copy(pending)

    def decode_fast_video(self, latents: torch.Tensor) -> torch.Tensor:
        """The fast path's float output [1, 3, F, H, W] in [-1, 1] (tests, quality checks)."""
        import torch

        with torch.inference_mode():
            chunks = list(self._run_chunks(self._as_clip(latents), self._video_step))
            return torch.cat(chunks, dim=2)

    def verify_fast_path(self, latents: torch.Tensor) -> float:
        """Compile the fast path at this clip's resolution now and check it: PSNR (dB) of its
        frames against the plain eager decode of `latents`. At or above checked_compile.MIN_PSNR_DB,
        requests of that resolution decode compiled from then on; below it (a miscompile: torch
        2.11 gave 14.5 dB) they stay on the eager step, with an error logged, so wrong frames are
        never served. Call at warmup with random latents (zeros decode to near-flat frames that
        hide layout bugs)."""
        clip = self._as_clip(latents)
        return self.checked.warm(self.shape_key(clip), lambda key: self._fast_vs_plain_psnr_db(clip))

    def warm_decode(self, latents: torch.Tensor) -> float | None:
        """Boot warmup of one size: a clip's fast path compiled and checked now, inline, so the
        first request of that size decodes compiled (its PSNR, dB); a single image decodes on the
        plain path (None). A size decoded through `decode_uint8` at warmup would instead compile in
        the background and swap in mid-traffic: the first requests decode eagerly, slower, and with
        different bytes from those after the swap."""
        if self.choose_path(self._as_clip(latents).shape[2]) == "plain":
            self.decode_uint8(latents)
            return None
        psnr_db = self.verify_fast_path(latents)
        logger.info("VAE fast decode %s against the plain decode: %.1f dB", tuple(latents.shape), psnr_db)
        return psnr_db

    def shape_key(self, latents: torch.Tensor) -> tuple[int, ...]:
        """What the compiled step's graphs depend on: latent channels, height and width, and the
        lengths of the chunks after the first (one graph per length)."""
        _, channels, num_frames, height, width = latents.shape
        later = sorted(
            {stop - start for start, stop in chunk_bounds(num_frames, self.chunk_latent_frames)[1:]}
        )
        return (channels, height, width, *reversed(later))

    def _check_shape(self, key: tuple[int, ...]) -> float:
        """Off the serving path: compile this key's graphs on seeded random latents and check them."""
        from mstar.diffusion.noise import seeded_noise

        channels, height, width, *later = key
        shape = (1, channels, 1 + sum(later), height, width)  # chunks: the first, then each length
        return self._fast_vs_plain_psnr_db(seeded_noise(shape, seed=0).to(self.device, self.dtype))

    def _fast_vs_plain_psnr_db(self, latents: torch.Tensor) -> float:
        from mstar.engine.checked_compile import module_calls

        fast = self.decode_fast_uint8(latents)
        with module_calls():  # eager modules: not while another thread traces
            return uint8_psnr_db(fast, self.decode_plain_uint8(latents))

    def _serving_step(self, latents: torch.Tensor):
        """The compiled step once this resolution was checked, else the eager one (and its check
        starts in the background)."""
        return self._uint8_step if self.checked.use_compiled(self.shape_key(latents)) else self._step_uint8

    def finish_warmup(self) -> None:
        """After warmup decodes: a compile from now on is a recompile (logged, counted)."""
        for step in (self._uint8_step, self._video_step):
            if hasattr(step, "finish_warmup"):
                step.finish_warmup()

    @property
    def num_recompiles(self) -> int:
        return sum(getattr(step, "num_recompiles", 0) for step in (self._uint8_step, self._video_step))

    @property
    def num_background_compiles(self) -> int:
        return sum(
            getattr(step, "num_background_compiles", 0) for step in (self._uint8_step, self._video_step)
        )

    # -- internals --------------------------------------------------------------------------------

    def _as_clip(self, latents: torch.Tensor) -> torch.Tensor:
        if latents.dim() == 4:
            latents = latents.unsqueeze(0)
        if latents.dim() != 5 or latents.shape[0] != 1 or latents.shape[2] < 1:
            raise ValueError(f"decode one clip at a time: latents [C, F, H, W], got {tuple(latents.shape)}")
        return latents

    def _run_chunks(self, latents: torch.Tensor, step):
        """Yield the step output for each latent frame in order, carrying the causal tails."""
        import torch

        x = latents.to(self.device, self.dtype)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        # Each chunk copied to canonical strides: a slice's batch stride depends on the clip length,
        # and compiled steps guard on it (one recompile per clip length otherwise).
        memory_format = torch.channels_last_3d if self.channels_last else torch.contiguous_format
        tails = None
        for start, stop in chunk_bounds(x.shape[2], self.chunk_latent_frames):
            output, tails = step(x[:, :, start:stop].clone(memory_format=memory_format), tails)
            yield output

    def _step_video(self, x: torch.Tensor, tails: list[torch.Tensor] | None):
        # x: [1, z, 1, h, w] -> video [1, 3, f, H, W]
        frames, tails = self.decoder.decode_chunk(self.decoder.post_quant_conv(x), tails)
        return self.decoder.to_video(frames).clamp(-1.0, 1.0), tails

    def _step_uint8(self, x: torch.Tensor, tails: list[torch.Tensor] | None):
        # x: [1, z, 1, h, w] -> uint8 frames [f, H, W, 3]
        frames, tails = self.decoder.decode_chunk(self.decoder.post_quant_conv(x), tails)
        return to_uint8_frames(self.decoder.to_video(frames))[0], tails


def _start_host_copy(frames: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """Queue a copy of device frames into pinned host memory; (host tensor, event marking its end)."""
    import torch

    if frames.device.type != "cuda":
        return frames, None
    host = torch.empty(frames.shape, dtype=frames.dtype, pin_memory=True)
    host.copy_(frames, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return host, done


def _finish_host_copy(copy: tuple[torch.Tensor, Any]) -> torch.Tensor:
    host, done = copy
    if done is not None:
        done.synchronize()
    return host
