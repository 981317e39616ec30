"""Media encoding and decoding: frames (uint8 [F, H, W, 3]) to PNG/JPEG/WEBP or MP4 (with an AAC
audio track when the model makes sound), uploads to frames.

Pillow and PyAV import lazily: encoding runs off the event loop (asyncio.to_thread) in the API process.
"""

from __future__ import annotations

import base64
import binascii
import io
import threading
from typing import Any

from mstar.errors import InvalidParam

IMAGE_FORMATS = ("png", "jpeg", "webp")
IMAGE_MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
VIDEO_MEDIA_TYPE = "video/mp4"
# Uploaded reference images are bounded before decoding (decompression-bomb guard).
MAX_UPLOAD_PIXELS = 4096 * 4096
# The only decoders an upload reaches: Pillow would otherwise try each of its ~40 plugins (PSD,
# TIFF, EPS, ...), each an attack surface for a format the API does not take.
UPLOAD_FORMATS = ("PNG", "JPEG", "WEBP")


def _as_uint8_frames(frames: Any) -> Any:
    """Accept [H, W, 3] or [F, H, W, 3] uint8; returns a numpy array [F, H, W, 3]."""
    import numpy as np

    array = np.asarray(frames)
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"frames must be uint8 [F, H, W, 3], got shape {tuple(array.shape)}")
    if array.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {array.dtype}")
    return np.ascontiguousarray(array)


# zlib's fastest level: the encode is on every image request's latency path (a 1024x1024 PNG took
# 186 ms at Pillow's default level 6 and 158 ms at 1 on the H200's host for a detailed image; files
# grow a little for detailed images, more for flat ones). PNGs are deflated on every core (png.py).
PNG_COMPRESS_LEVEL = 1


def encode_image(frame: Any, output_format: str = "png", quality: int | None = None) -> bytes:
    """One uint8 image [H, W, 3] (or [1, H, W, 3]) to PNG, JPEG or WEBP bytes."""
    if output_format not in IMAGE_FORMATS:
        raise ValueError(f"output_format must be one of {IMAGE_FORMATS}, got '{output_format}'")
    frames = _as_uint8_frames(frame)
    if output_format == "png":
        from mstar.api.png import encode_png

        return encode_png(frames[0], level=PNG_COMPRESS_LEVEL)
    from PIL import Image

    buffer = io.BytesIO()
    quality = 95 if quality is None else quality
    Image.fromarray(frames[0], mode="RGB").save(buffer, format=output_format.upper(), quality=quality)
    return buffer.getvalue()


# x264's own thread count, fixed: left to PyAV it follows the machine's cores, and x264's output
# bytes depend on its thread count, so the same frames gave other MP4 bytes on another machine.
# 8: on the H200's 16-core host a 832x480x33 clip took 174 ms whole (automatic: 170, 4: 232) and
# 38 ms after its last chunk when muxed as the VAE decodes (4: 54); on 2 cores, 10% over automatic.
MP4_ENCODE_THREADS = 8
# x264's threads split each frame into slices (PyAV's default, fixed here because the bytes depend on
# it): frame threads would hold `threads - 1` more frames back, each still to encode at the flush.
MP4_THREAD_TYPE = "SLICE"
# mbtree off: see Mp4Writer._open. A module constant so bench/encode_speed.py can time other settings.
MP4_X264_PARAMS = "mbtree=0"
# ffmpeg's native AAC encoder (always in PyAV's builds); planar float in, 1024 samples a frame.
AUDIO_CODEC = "aac"
AUDIO_LAYOUTS = {1: "mono", 2: "stereo"}


def _as_float_waveform(waveform: Any, num_channels: int) -> Any:
    """Accept [samples] (mono) or [channels, samples] float; returns float32 [channels, samples] in [-1, 1]."""
    import numpy as np

    array = np.asarray(waveform, dtype=np.float32)
    if array.ndim == 1:
        array = array[None]
    if array.ndim != 2 or array.shape[0] != num_channels:
        raise ValueError(f"audio must be float [{num_channels}, samples], got shape {tuple(array.shape)}")
    if not np.isfinite(array).all():
        raise ValueError("audio samples must be finite")
    return np.clip(array, -1.0, 1.0)


class Mp4Writer:
    """An H.264 MP4 (yuv420p) written piece by piece: frames are encoded as they come, so a clip's
    encode overlaps its decode; `finish()` flushes and returns the bytes. The same frames give the
    same bytes however they are split into pieces. Odd sides are padded by one pixel (edge copy).

        writer = Mp4Writer(fps=16)
        writer.write(frames_0_to_4)   # uint8 [f, H, W, 3]
        writer.write(frames_5_to_8)
        data = writer.finish()        # or writer.close() to drop it (a failed request)

    With `audio_sample_rate` the file also carries an AAC track: `write_audio(waveform)` (float
    [channels, samples] in [-1, 1], any time before finish) gives its samples; finish() cuts or
    pads them with silence to the video's duration, so both tracks end together (within the last
    AAC frame of 1024 samples). Without it the video is written exactly as before (same bytes).
    """

    def __init__(self, fps: int, audio_sample_rate: int | None = None, audio_channels: int = 2):
        if fps <= 0:
            raise ValueError(f"fps must be positive, got {fps}")
        if audio_sample_rate is not None and audio_sample_rate <= 0:
            raise ValueError(f"audio_sample_rate must be positive, got {audio_sample_rate}")
        if audio_channels not in AUDIO_LAYOUTS:
            raise ValueError(f"audio_channels must be one of {sorted(AUDIO_LAYOUTS)}, got {audio_channels}")
        self.fps = int(fps)
        self.audio_sample_rate = audio_sample_rate
        self.audio_channels = audio_channels
        self._audio_pieces: list[Any] = []
        self._audio_stream: Any = None
        self._lock = threading.Lock()  # one call at a time: a close may come while a write runs
        self.num_frames = 0
        self._buffer = io.BytesIO()
        self._container: Any = None
        self._stream: Any = None
        self._size: tuple[int, int] | None = None  # (height, width) of the frames given
        self._closed = False

    @property
    def frame_size(self) -> tuple[int, int] | None:
        """(height, width) of the frames written, before any padding; None before the first."""
        return self._size

    def write(self, frames: Any) -> None:
        import av

        frames = self._padded(_as_uint8_frames(frames))
        with self._lock:
            self._check_open()
            if self._stream is None:
                self._open(frames.shape[2], frames.shape[1])
            for frame in frames:
                for packet in self._stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                    self._container.mux(packet)
            self.num_frames += len(frames)

    def write_audio(self, waveform: Any) -> None:
        """Samples of the audio track (appended to those written before)."""
        samples = _as_float_waveform(waveform, self.audio_channels)
        with self._lock:
            self._check_open()
            if self.audio_sample_rate is None:
                raise ValueError("this MP4 writer has no audio track (give audio_sample_rate)")
            self._audio_pieces.append(samples)

    @property
    def num_audio_samples(self) -> int:
        """Samples the audio track gets: the video's duration at the audio rate (0 without audio)."""
        if self.audio_sample_rate is None:
            return 0
        return round(self.num_frames * self.audio_sample_rate / self.fps)

    def finish(self) -> bytes:
        with self._lock:
            self._check_open()
            if self._stream is None:
                raise ValueError("an MP4 needs at least one frame")
            if self.audio_sample_rate is not None and not self._audio_pieces:
                raise ValueError("this MP4 has an audio track but no audio was written")
            for packet in self._stream.encode():
                self._container.mux(packet)
            if self._audio_stream is not None:
                self._mux_audio()
            self._close()
            return self._buffer.getvalue()

    def _mux_audio(self) -> None:
        import av
        import numpy as np

        samples = np.concatenate(self._audio_pieces, axis=1)
        target = self.num_audio_samples
        if samples.shape[1] < target:
            samples = np.pad(samples, ((0, 0), (0, target - samples.shape[1])))
        samples = np.ascontiguousarray(samples[:, :target])
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout=AUDIO_LAYOUTS[self.audio_channels])
        frame.sample_rate = self.audio_sample_rate
        frame.pts = 0
        for packet in self._audio_stream.encode(frame):  # PyAV cuts it into the codec's frames
            self._container.mux(packet)
        for packet in self._audio_stream.encode():
            self._container.mux(packet)

    def close(self) -> None:
        """Drop the writer (after finish, a no-op)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the MP4 writer is closed")

    def _padded(self, frames: Any) -> Any:
        import numpy as np

        height, width = frames.shape[1:3]
        if self._size is None:
            self._size = (height, width)
        elif self._size != (height, width):
            raise ValueError(f"frames of {width}x{height} after frames of {self._size[1]}x{self._size[0]}")
        # yuv420p needs even sides; pad by edge replication rather than crop so no content is lost.
        pad_h, pad_w = height % 2, width % 2
        if pad_h or pad_w:
            frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
        return frames

    def _open(self, width: int, height: int) -> None:
        import av

        self._container = av.open(self._buffer, mode="w", format="mp4")
        stream = self._container.add_stream("libx264", rate=self.fps)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_count = MP4_ENCODE_THREADS
        stream.codec_context.thread_type = MP4_THREAD_TYPE
        # mbtree off: x264's macroblock-tree rate control read memory left by earlier encodes of
        # other sizes, so the same frames gave other bytes (a server's first video differed from its
        # repeats: 40.6 dB). Off, the bytes depend on the frames only; mbtree's usual gain in
        # compression on natural video is given up (a noise-like random-weight clip came out 4%
        # smaller and 14% faster to encode on CPU).
        stream.options = {"crf": "18", "preset": "veryfast", "x264-params": MP4_X264_PARAMS}
        self._stream = stream
        if self.audio_sample_rate is not None:
            layout = AUDIO_LAYOUTS[self.audio_channels]
            self._audio_stream = self._container.add_stream(
                AUDIO_CODEC, rate=self.audio_sample_rate, layout=layout
            )


def encode_mp4(frames: Any, fps: int, audio: Any = None, audio_sample_rate: int | None = None) -> bytes:
    """uint8 frames [F, H, W, 3] to an H.264 MP4 (yuv420p, so odd sizes are padded by one pixel),
    with an AAC track of `audio` (float [channels, samples]) at `audio_sample_rate` when given."""
    import numpy as np

    if (audio is None) != (audio_sample_rate is None):
        raise ValueError("give both audio and audio_sample_rate, or neither")
    channels = 2 if audio is None or np.ndim(audio) != 1 else 1
    if audio is not None and np.ndim(audio) == 2:
        channels = int(np.shape(audio)[0])
    writer = Mp4Writer(fps, audio_sample_rate, channels)
    try:
        writer.write(frames)
        if audio is not None:
            writer.write_audio(audio)
        return writer.finish()
    finally:
        writer.close()


def warm_up_encoders(output_kind: str) -> None:
    """Import and run the encoders the model's outputs need once, at startup: the first request
    would otherwise pay the imports and the codecs' first use (about 0.1 s each for Pillow and
    PyAV on a CPU core)."""
    import numpy as np

    frames = np.zeros((2, 16, 16, 3), dtype=np.uint8)
    encode_image(frames[0])
    if output_kind == "video":
        encode_mp4(frames, fps=8)
    if output_kind == "video+audio":
        encode_mp4(frames, fps=8, audio=np.zeros((2, 4000), dtype=np.float32), audio_sample_rate=16000)


def decode_mp4(data: bytes) -> Any:
    """MP4 bytes to uint8 frames [F, H, W, 3] (tests and the SDK's users)."""
    import av
    import numpy as np

    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames)


def decode_mp4_audio(data: bytes) -> tuple[Any, int]:
    """The audio track of MP4 bytes: (float32 [channels, samples], sample rate) (tests and the SDK)."""
    import av
    import numpy as np

    with av.open(io.BytesIO(data), mode="r") as container:
        if not container.streams.audio:
            raise ValueError("the MP4 has no audio track")
        rate = container.streams.audio[0].sample_rate
        pieces = [frame.to_ndarray() for frame in container.decode(audio=0)]
    return np.concatenate(pieces, axis=1).astype(np.float32), rate


def decode_image(data: bytes, param: str = "input_reference") -> Any:
    """Uploaded PNG, JPEG or WebP bytes to uint8 RGB [H, W, 3]; InvalidParam for any other format
    (never handed to another decoder) or an unreadable image."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidParam(param, "the image is empty")
    try:
        with Image.open(io.BytesIO(data), formats=UPLOAD_FORMATS) as image:
            width, height = image.size
            if width * height > MAX_UPLOAD_PIXELS:
                raise InvalidParam(
                    param, f"the image is {width}x{height}; at most {MAX_UPLOAD_PIXELS} pixels"
                )
            rgb = image.convert("RGB")
            rgb.load()
    except InvalidParam:
        raise
    except UnidentifiedImageError as error:
        raise InvalidParam(
            param, "the image is not a PNG, JPEG or WebP file (the formats accepted)"
        ) from error
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise InvalidParam(param, "could not decode the image (use PNG, JPEG or WebP)") from error
    return np.asarray(rgb, dtype=np.uint8)


def decode_data_url(url: str, param: str = "input_reference") -> bytes:
    """`data:image/...;base64,...` to bytes. Remote URLs are refused: the server never fetches them."""
    if not url.startswith("data:"):
        raise InvalidParam(param, "only base64 data URLs (data:image/png;base64,...) are accepted")
    header, _, payload = url.partition(",")
    if not header.endswith(";base64") or not payload:
        raise InvalidParam(param, "the data URL must be base64-encoded")
    return decode_base64(payload, param)


def decode_base64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidParam(param, "invalid base64") from error
