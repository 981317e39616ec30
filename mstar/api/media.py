"""Media encoding and decoding: frames (uint8 [F, H, W, 3]) to PNG/JPEG/WEBP or MP4, uploads to frames.

Pillow and PyAV import lazily: encoding runs off the event loop (asyncio.to_thread) in the API process.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

from mstar.errors import InvalidParam

IMAGE_FORMATS = ("png", "jpeg", "webp")
IMAGE_MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
VIDEO_MEDIA_TYPE = "video/mp4"
# Uploaded reference images are bounded before decoding (decompression-bomb guard).
MAX_UPLOAD_PIXELS = 4096 * 4096


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


def encode_mp4(frames: Any, fps: int) -> bytes:
    """uint8 frames [F, H, W, 3] to an H.264 MP4 (yuv420p, so odd sizes are padded by one pixel)."""
    import av
    import numpy as np

    frames = _as_uint8_frames(frames)
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    num_frames, height, width, _ = frames.shape
    # yuv420p needs even sides; pad by edge replication rather than crop so no content is lost.
    pad_h, pad_w = height % 2, width % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height = width + pad_w, height + pad_h
        stream.pix_fmt = "yuv420p"
        # mbtree off: x264's macroblock-tree rate control read memory left by earlier encodes of
        # other sizes, so the same frames gave other bytes (a server's first video differed from its
        # repeats: 40.6 dB). Off, the bytes depend on the frames only; mbtree's usual gain in
        # compression on natural video is given up (a noise-like random-weight clip came out 4%
        # smaller and 14% faster to encode on CPU).
        stream.options = {"crf": "18", "preset": "veryfast", "x264-params": "mbtree=0"}
        for index in range(num_frames):
            video_frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            for packet in stream.encode(video_frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def warm_up_encoders(output_kind: str) -> None:
    """Import and run the encoders the model's outputs need once, at startup: the first request
    would otherwise pay the imports and the codecs' first use (about 0.1 s each for Pillow and
    PyAV on a CPU core)."""
    import numpy as np

    frames = np.zeros((2, 16, 16, 3), dtype=np.uint8)
    encode_image(frames[0])
    if output_kind == "video":
        encode_mp4(frames, fps=8)


def decode_mp4(data: bytes) -> Any:
    """MP4 bytes to uint8 frames [F, H, W, 3] (tests and the SDK's users)."""
    import av
    import numpy as np

    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return np.stack(frames)


def decode_image(data: bytes, param: str = "input_reference") -> Any:
    """Uploaded image bytes (PNG/JPEG/WEBP/...) to uint8 RGB [H, W, 3]; InvalidParam when unreadable."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise InvalidParam(param, "the image is empty")
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_UPLOAD_PIXELS:
                raise InvalidParam(
                    param, f"the image is {width}x{height}; at most {MAX_UPLOAD_PIXELS} pixels"
                )
            rgb = image.convert("RGB")
            rgb.load()
    except InvalidParam:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise InvalidParam(param, "could not decode the image (use PNG, JPEG or WEBP)") from error
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
