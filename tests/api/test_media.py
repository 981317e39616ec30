"""Media encoding: PNG/JPEG/WEBP via Pillow, MP4 via PyAV, uploads decoded to uint8 RGB."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mstar.api.media import Mp4Writer, decode_data_url, decode_image, decode_mp4, encode_image, encode_mp4
from mstar.errors import InvalidParam


def ramp(num_frames: int, height: int, width: int) -> np.ndarray:
    """uint8 [F, H, W, 3], smooth so lossy codecs stay close."""
    y = np.linspace(0, 200, height)[None, :, None, None]
    x = np.linspace(0, 50, width)[None, None, :, None]
    t = np.arange(num_frames)[:, None, None, None] * 5
    frames = np.broadcast_to(y + x + t + np.array([0, 20, 40]), (num_frames, height, width, 3))
    return np.ascontiguousarray(frames.clip(0, 255).astype(np.uint8))


def test_png_is_lossless():
    frame = np.random.default_rng(0).integers(0, 256, (17, 23, 3), dtype=np.uint8)
    data = encode_image(frame, "png")
    assert data.startswith(b"\x89PNG")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), frame)


@pytest.mark.parametrize(("output_format", "magic"), [("jpeg", b"\xff\xd8"), ("webp", b"RIFF")])
def test_lossy_formats_round_trip_closely(output_format, magic):
    frame = ramp(1, 32, 48)
    data = encode_image(frame, output_format)
    assert data.startswith(magic)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert decoded.shape == (32, 48, 3)
    assert np.abs(decoded.astype(int) - frame[0].astype(int)).mean() < 3


def test_image_rejects_bad_arrays():
    with pytest.raises(ValueError, match="uint8"):
        encode_image(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        encode_image(np.zeros((4, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="output_format"):
        encode_image(np.zeros((4, 4, 3), dtype=np.uint8), "gif")


@pytest.mark.parametrize(("height", "width"), [(32, 48), (33, 17)])
def test_mp4_round_trip(height, width):
    frames = ramp(9, height, width)
    data = encode_mp4(frames, fps=8)
    assert data[4:8] == b"ftyp"
    decoded = decode_mp4(data)
    # odd sides are padded by one replicated pixel for yuv420p
    assert decoded.shape == (9, height + height % 2, width + width % 2, 3)
    assert np.abs(decoded[:, :height, :width].astype(int) - frames.astype(int)).mean() < 4


def test_mp4_frame_rate():
    import av

    data = encode_mp4(ramp(16, 16, 16), fps=16)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        assert stream.average_rate == 16
        assert stream.frames == 16


def test_decode_upload_and_data_url():
    buffer = io.BytesIO()
    Image.new("RGBA", (5, 3), (1, 2, 3, 128)).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    image = decode_image(decode_data_url(url))
    assert image.shape == (3, 5, 3) and image.dtype == np.uint8 and tuple(image[0, 0]) == (1, 2, 3)


@pytest.mark.parametrize("data", [b"", b"GIF89a garbage", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20])
def test_decode_rejects_garbage(data):
    with pytest.raises(InvalidParam) as error:
        decode_image(data)
    assert error.value.param == "input_reference"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decode_takes_png_jpeg_webp(fmt):
    buffer = io.BytesIO()
    Image.new("RGB", (6, 4), (250, 0, 0)).save(buffer, format=fmt, quality=100)
    image = decode_image(buffer.getvalue())
    assert image.shape == (4, 6, 3) and image[0, 0, 0] > 200


@pytest.mark.parametrize("fmt", ["BMP", "GIF", "TIFF", "ICO", "PPM", "TGA"])
def test_decode_refuses_formats_pillow_reads_but_the_api_does_not_take(fmt):
    buffer = io.BytesIO()
    Image.new("RGB", (6, 4), (250, 0, 0)).save(buffer, format=fmt)
    Image.open(io.BytesIO(buffer.getvalue())).load()  # a valid image Pillow could decode
    with pytest.raises(InvalidParam, match="not a PNG, JPEG or WebP") as error:
        decode_image(buffer.getvalue())
    assert error.value.param == "input_reference"


def test_decode_rejects_huge_images():
    buffer = io.BytesIO()
    Image.new("L", (5000, 4000)).save(buffer, format="PNG")
    with pytest.raises(InvalidParam, match="pixels"):
        decode_image(buffer.getvalue())


@pytest.mark.parametrize(
    "url", ["http://example.com/a.png", "data:image/png,abc", "data:image/png;base64,@@"]
)
def test_data_url_rejections(url):
    with pytest.raises(InvalidParam):
        decode_data_url(url)


@pytest.mark.parametrize(("spec_class", "kind"), [("FakeImageSpec", "image"), ("FakeVideoSpec", "video")])
def test_the_app_warms_up_the_encoders_its_outputs_need_before_serving(monkeypatch, spec_class, kind):
    from mstar.api import app as app_module
    from tests.api import fakes
    from tests.api.conftest import build_client

    kinds = []
    monkeypatch.setattr(app_module, "warm_up_encoders", kinds.append)
    client, _ = build_client(getattr(fakes, spec_class)())
    assert kinds == []
    with client:
        assert kinds == [kind]


def test_warming_up_runs_each_encoder_once_for_real():
    import sys

    from mstar.api.media import warm_up_encoders

    warm_up_encoders("image")
    assert "PIL.PngImagePlugin" in sys.modules
    warm_up_encoders("video")  # PNG and a two-frame MP4
    assert "av" in sys.modules


def drifting_noise(seed: int, height: int, width: int, num_frames: int) -> np.ndarray:
    """Noise that slides one pixel right per frame, plus fresh noise: motion x264 must track."""
    rng = np.random.default_rng(seed)
    base = rng.normal(128, 40, (height, width, 3))
    frames = [np.roll(base, t, axis=1) + rng.normal(0, 8, base.shape) for t in range(num_frames)]
    return np.stack(frames).clip(0, 255).astype(np.uint8)


def test_mp4_bytes_do_not_depend_on_the_encodes_before():
    """x264's macroblock-tree rate control read memory left by earlier encodes of other sizes (a
    server's first video differed from its repeats); with it off, the same frames give the same bytes."""
    clip = drifting_noise(0, 240, 416, 33)
    others = [drifting_noise(s, 240 + 16 * s, 416 - 32 * s, 9 + 8 * s) for s in range(1, 5)]
    outputs = set()
    for index in range(8):
        outputs.add(encode_mp4(clip, fps=16))
        encode_mp4(others[index % len(others)], fps=16)
    assert len(outputs) == 1


def test_mp4_written_in_pieces_is_the_same_file_as_written_whole():
    clip = drifting_noise(3, 48, 62, 9)
    writer = Mp4Writer(fps=16)
    for start, stop in ((0, 1), (1, 5), (5, 9)):  # Wan's VAE chunks: 1 frame, then 4 at a time
        writer.write(clip[start:stop])
    assert writer.num_frames == 9
    assert writer.finish() == encode_mp4(clip, fps=16)
    writer.close()  # after finish: nothing left to drop


def test_mp4_writer_refuses_what_it_cannot_write():
    writer = Mp4Writer(fps=8)
    with pytest.raises(ValueError, match="at least one frame"):
        writer.finish()
    writer.write(np.zeros((1, 16, 16, 3), np.uint8))
    with pytest.raises(ValueError, match="16x16"):
        writer.write(np.zeros((1, 16, 32, 3), np.uint8))
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(np.zeros((1, 16, 16, 3), np.uint8))
    with pytest.raises(ValueError, match="fps"):
        Mp4Writer(fps=0)


MP4_ON_CORES = """
import hashlib, os, sys
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
import numpy as np
from mstar.api.media import encode_mp4
from tests.api.test_media import drifting_noise
print(hashlib.sha256(encode_mp4(drifting_noise(1, 160, 256, 9), fps=16)).hexdigest())
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores"
)
def test_mp4_bytes_do_not_depend_on_the_machines_cores():
    """x264's output depends on its thread count, which by default follows the cores a process may
    use: fixed, the same frames give the same bytes on a machine of any size."""
    first, second = sorted(os.sched_getaffinity(0))[:2]
    digests = {
        subprocess.run(
            [sys.executable, "-c", MP4_ON_CORES, cores], capture_output=True, text=True, check=True
        ).stdout.strip()
        for cores in (f"{first}", f"{first},{second}")
    }
    assert len(digests) == 1


def test_b64_json_body_is_the_json_document_json_dumps_would_give():
    """The images route assembles its b64_json body around the base64 text; it parses to the same
    document as the dict it replaced, for no, one and several images."""
    import base64
    import json

    from mstar.api.routes_images import b64_json_body

    for images in ([], [b"\x00\xff png bytes"], [bytes(range(256)) * 3, b"x"]):
        body = b64_json_body(images, "webp", "832x480", 1_764_000_000)
        assert json.loads(body) == {
            "created": 1_764_000_000,
            "data": [{"b64_json": base64.b64encode(image).decode("ascii")} for image in images],
            "output_format": "webp",
            "size": "832x480",
        }
